"""Benchmarks: bertflow's encoder against ``SentenceTransformer.encode``, flow fitting, calibrator overhead, memory.

Every comparison runs both sides in one process on the same model, sentences, device and precision, in
alternating rounds (A B, then B A, ...), and reports the median: background load on a shared machine then
hits both sides alike, and the printed ratio is measured, not assembled from separate runs.

Units: seconds, sentences/s, tokens/s; "real" tokens are the sentences' own tokens after truncation (special
tokens included), "padded" tokens are what the model computed on (rows x width summed over batches). Model
FLOP utilisation (MFU) counts the useful FLOPs only (real tokens, no padding) against a peak rate.

Used by ``bertflow bench ...`` (``bertflow/cli/bench.py``) and the scripts in ``benchmarks/``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "H100_BF16_PEAK",
    "MODEL_CONFIGS",
    "bench_calibrator_overhead",
    "bench_encode",
    "bench_flow_fit",
    "bench_flow_fit_gpu",
    "bench_memory",
    "build_random_model",
    "environment",
    "interleave",
    "long_texts",
    "model_flops",
    "replicate",
    "st_padded_tokens",
    "sts_sentences",
    "synthetic_sentences",
]

#: H100 SXM dense bf16 peak (datasheet), FLOP/s. The lent H100 reached 798 TFLOP/s on an 8192^3 GEMM.
H100_BF16_PEAK = 989e12

#: Architectures of the random-weight models built for GPU runs (no network there): BertConfig overrides.
MODEL_CONFIGS: dict[str, dict[str, int]] = {
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    # all-MiniLM-L6-v2's architecture
    "minilm-l6": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    # a toy for smoke tests of the benchmark code itself
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
}


# -- data ---------------------------------------------------------------------------------------------------


def sts_sentences(data_dir: str | Path | None = None) -> list[str]:
    """Distinct sentences of every STS task (STS12-16, STS-B, SICK-R; about 29.5k), in first-seen order."""
    from .evaluation.datasets import load_sts_tasks

    tasks = load_sts_tasks(data_dir=data_dir)
    return list(dict.fromkeys(s for task in tasks.values() for s in task.fit_sentences("target")))


def synthetic_sentences(n: int, seed: int = 0, min_words: int = 4, max_words: int = 30) -> list[str]:
    """STS-like text when no data is at hand: Zipf-distributed pseudo-words, 4-30 per sentence."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "an", "el", "or"]
    vocab = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(20000)]
    ranks = np.minimum(rng.zipf(1.3, size=n * max_words), len(vocab)) - 1
    lengths = rng.integers(min_words, max_words + 1, size=n)
    out, pos = [], 0
    for k in lengths:
        out.append(" ".join(vocab[r] for r in ranks[pos : pos + k]).capitalize() + ".")
        pos += k
    return out


def replicate(sentences: Sequence[str], n: int, seed: int = 0) -> list[str]:
    """``n`` sentences drawn by cycling through a seeded shuffle of ``sentences`` (a throughput set)."""
    order = np.random.default_rng(seed).permutation(len(sentences))
    return [sentences[order[i % len(order)]] for i in range(n)]


def long_texts(sentences: Sequence[str], n: int, seed: int = 0, per_text: tuple[int, int] = (6, 14)) -> list[str]:
    """``n`` paragraph-length texts (6-14 sentences joined, about 80-250 tokens): the longer-text set."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(per_text[0], per_text[1] + 1))
        start = int(rng.integers(0, max(1, len(sentences) - k)))
        out.append(" ".join(sentences[start : start + k]))
    return out


# -- models -------------------------------------------------------------------------------------------------


def build_random_model(arch: str, tokenizer_dir: str | Path, out_dir: str | Path, seed: int = 0) -> Path:
    """Save a random-weight BERT of a known architecture (:data:`MODEL_CONFIGS`) with a local tokenizer.

    Speed does not depend on the weights, so this stands in for bert-base / all-MiniLM-L6-v2 where there is no
    network. ``tokenizer_dir`` holds ``vocab.txt`` or ``tokenizer.json`` (e.g. the packaged default model's).
    """
    from transformers import AutoTokenizer, BertConfig, BertModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **MODEL_CONFIGS[arch])
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def model_flops(config: Any, lengths: np.ndarray) -> float:
    """Useful forward FLOPs of an encoder over sentences of ``lengths`` tokens (no padding counted).

    Per token: ``2 L (4 d^2 + 2 d d_ff)`` for the matrix products, plus ``4 L T d`` for attention (Q K^T and
    A V) in a sequence of T tokens; embeddings are lookups and the pooler is ignored.
    """
    layers, d, d_ff = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    lengths = np.asarray(lengths, dtype=np.float64)
    per_token = 2 * layers * (4 * d * d + 2 * d * d_ff)
    return float((lengths * per_token + 4 * layers * d * lengths**2).sum())


def st_padded_tokens(lengths: np.ndarray, texts: Sequence[str], batch_size: int) -> int:
    """Padded tokens of ``SentenceTransformer.encode``: sorted by *character* length, fixed-size batches."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    lengths = np.asarray(lengths)[order]
    return int(sum(len(b) * b.max() for b in np.array_split(lengths, math.ceil(len(lengths) / batch_size))))


# -- timing -------------------------------------------------------------------------------------------------


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleave(runs: dict[str, Callable[[], Any]], rounds: dict[str, int] | int) -> dict[str, list[float]]:
    """Time each callable ``rounds`` times, alternating their order round by round (A B, B A, A B ...).

    Returns:
        seconds per run, by name. A name with fewer rounds than others drops out of the later rounds.
    """
    counts = {name: rounds if isinstance(rounds, int) else rounds[name] for name in runs}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(max(counts.values())):
        names = [n for n in runs if counts[n] > r]
        for name in names if r % 2 == 0 else names[::-1]:
            _sync()
            start = time.perf_counter()
            runs[name]()
            _sync()
            times[name].append(time.perf_counter() - start)
    return times


def environment(device: str) -> dict[str, Any]:
    """Versions, CPU count and load, and the GPU's name: what a reader needs to compare numbers."""
    import tokenizers
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "device": device,
    }
    try:
        import sentence_transformers

        env["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


@dataclass
class _Side:
    """One system in an encoding comparison."""

    name: str
    run: Callable[[], Any]
    padded_tokens: Callable[[], int]
    rounds: int
    times: list[float] = field(default_factory=list)


def bench_encode(
    model_path: str,
    datasets: dict[str, tuple[list[str], int]],
    *,
    device: str,
    dtype: str = "auto",
    st_batch_sizes: Sequence[int] = (32,),
    rounds: int = 3,
    st_rounds: int | None = None,
    peak_flops: float | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    variant_rounds: int = 1,
    check_agreement: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Encoding throughput, bertflow against ``SentenceTransformer.encode``, side by side.

    Args:
        model_path: a Hugging Face model folder (sentence-transformers wraps it with mean pooling).
        datasets: name -> (sentences, max_length); both systems truncate to the same max_length.
        device, dtype: where and in which precision both run ("auto": bf16 on CUDA, fp32 on CPU).
        st_batch_sizes: ``SentenceTransformer.encode`` batch sizes to compare with (32 is its default).
        rounds, st_rounds: timed runs of bertflow / of each sentence-transformers setting (median reported).
        peak_flops: FLOP/s to compute MFU against (``None``: no MFU; on CUDA pass :data:`H100_BF16_PEAK`).
        variants: extra bertflow settings to time, name -> overrides (keys of ``_VARIANT_ATTRIBUTES`` and
            ``batch_size``), each timed ``variant_rounds`` times after the comparison.
        check_agreement: also compare the two systems' vectors (cosine) on the first 512 sentences.

    Returns:
        ``{"datasets": {name: {"sentences", "real_tokens", "systems": {system: metrics}, "ratios"}}}``.
    """
    from sentence_transformers import SentenceTransformer

    from .encoding.encoder import SentenceEncoder, _resolve_dtype

    torch_dtype = _resolve_dtype(dtype, torch.device(device))
    base = SentenceEncoder(model_path, pooling="mean", device=device, dtype=dtype)
    st = SentenceTransformer(model_path, device=device)
    st.to(torch_dtype)
    st_rounds = st_rounds or rounds
    results: dict[str, Any] = {"model": model_path, "dtype": str(torch_dtype)[6:], "datasets": {}}
    for ds_name, (sentences, max_length) in datasets.items():
        encoder = SentenceEncoder(
            model_path, model=base.model, tokenizer=base.tokenizer, max_length=max_length, device=device, dtype=dtype
        )
        st.max_seq_length = max_length
        lengths = np.asarray([len(x) for x in encoder.tokenize(sentences)])
        real = int(lengths.sum())
        flops = model_flops(encoder.model.config, lengths)
        # Warm-up: one full untimed pass of bertflow (its batch shapes, allocator pools) and 4,096 sentences of
        # each sentence-transformers setting (most of its batch shapes); first-time costs stay out of the medians.
        encoder.encode(sentences)
        for bs in st_batch_sizes:
            st.encode(sentences[: min(len(sentences), 4096)], batch_size=bs)
        entry: dict[str, Any] = {"sentences": len(sentences), "max_length": max_length, "real_tokens": real}
        if check_agreement:
            probe = sentences[:512]
            a = encoder.encode(probe).astype(np.float64)
            b = np.asarray(st.encode(probe, batch_size=64, convert_to_numpy=True), dtype=np.float64)
            cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            entry["agreement_min_cosine"] = float(cos.min())
        sides = [
            _Side(
                "bertflow",
                lambda s=sentences, e=encoder: e.encode(s),
                lambda e=encoder: e.last_stats.padded_tokens,
                rounds,
            )
        ]
        for bs in st_batch_sizes:
            sides.append(
                _Side(
                    f"sentence-transformers bs={bs}",
                    lambda s=sentences, bs=bs: st.encode(s, batch_size=bs),
                    lambda bs=bs, s=sentences, n=lengths: st_padded_tokens(n, s, bs),
                    st_rounds,
                )
            )
        log(f"[encode] {ds_name}: {len(sentences)} texts, {real / len(sentences):.1f} tokens each")
        times = interleave({s.name: s.run for s in sides}, {s.name: s.rounds for s in sides})
        systems = {}
        for side in sides:
            side.times = times[side.name]
            systems[side.name] = _throughput(len(sentences), real, side.padded_tokens(), flops, side.times, peak_flops)
            if side.name == "bertflow":
                systems[side.name]["uniform_batches"] = encoder.last_stats.uniform_batches
                systems[side.name]["batches"] = encoder.last_stats.batches
            log(f"  {side.name:34s} {_fmt(systems[side.name])}")
        ours = systems["bertflow"]["sentences_per_s"]
        entry["systems"] = systems
        entry["ratios"] = {
            f"bertflow / {name}": ours / m["sentences_per_s"] for name, m in systems.items() if name != "bertflow"
        }
        for k, v in entry["ratios"].items():
            log(f"  ratio {k}: {v:.2f}x")
        if variants:
            entry["variants"] = {}
            for vname, overrides in variants.items():
                entry["variants"][vname] = _time_variant(
                    encoder, sentences, overrides, variant_rounds, real, flops, peak_flops
                )
                log(f"  variant {vname:26s} {_fmt(entry['variants'][vname])}")
        results["datasets"][ds_name] = entry
    return results


#: Variant override -> encoder attribute (``batch_size`` goes to ``encode`` instead).
_VARIANT_ATTRIBUTES = {
    "max_tokens": "max_tokens",
    "tokenize_workers": "tokenize_workers",
    "tokenize_processes": "tokenize_processes",
    "uniform_fill": "_uniform_fill",
    "min_length_ratio": "_min_length_ratio",
    "first_chunk": "_first_chunk",
    "min_tokens": "_min_tokens",
    "cudnn_attention": "_cudnn_attention",
}


def _time_variant(
    encoder: Any,
    sentences: list[str],
    overrides: dict[str, Any],
    rounds: int,
    real: int,
    flops: float,
    peak: float | None,
) -> dict[str, Any]:
    saved = {attr: getattr(encoder, attr) for attr in _VARIANT_ATTRIBUTES.values()}
    for key, value in overrides.items():
        if key in _VARIANT_ATTRIBUTES:
            setattr(encoder, _VARIANT_ATTRIBUTES[key], value)
    try:
        batch_size = overrides.get("batch_size")
        times = interleave({"v": lambda: encoder.encode(sentences, batch_size=batch_size)}, rounds)["v"]
        out = _throughput(len(sentences), real, encoder.last_stats.padded_tokens, flops, times, peak)
        out["uniform_batches"], out["batches"] = encoder.last_stats.uniform_batches, encoder.last_stats.batches
        return out
    finally:
        for attr, value in saved.items():
            setattr(encoder, attr, value)


def _throughput(n: int, real: int, padded: int, flops: float, times: list[float], peak: float | None) -> dict[str, Any]:
    t = float(np.median(times))
    out = {
        "seconds": times,
        "median_s": t,
        "sentences_per_s": n / t,
        "real_tokens_per_s": real / t,
        "padded_tokens_per_s": padded / t,
        "padding_efficiency": real / padded if padded else 1.0,
    }
    if peak:
        out["mfu"] = flops / t / peak
    return out


def _fmt(m: dict[str, Any]) -> str:
    text = (
        f"{m['sentences_per_s']:>10,.0f} sent/s  {m['real_tokens_per_s'] / 1e6:6.3f}M real tok/s  "
        f"{m['padded_tokens_per_s'] / 1e6:6.3f}M padded tok/s  pad-eff {m['padding_efficiency']:.3f}"
    )
    if "mfu" in m:
        text += f"  MFU {100 * m['mfu']:4.1f}%"
    return text + f"  (median of {len(m['seconds'])})"


def bench_forward(
    model_path: str,
    shapes: Sequence[tuple[int, int]],
    *,
    device: str,
    reps: int = 10,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Cost of one forward pass of the bare model at fixed shapes: what a batch costs besides its tokens.

    For each (rows, width), with and without a padding mask, with cuDNN attention excluded and allowed:
    ``issue_ms`` (host time to launch one forward on an idle GPU), ``latency_ms`` (launch + wait), and
    ``per_call_ms`` (``reps`` forwards back to back, then one wait: the steady-state cost per batch).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .encoding.encoder import SentenceEncoder

    enc = SentenceEncoder(model_path, device=device)
    model, dev = enc.model, enc.device
    backends = {
        "no cuDNN": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
        "torch default": None,
    }
    out = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for rows, width in shapes:
        ids = torch.randint(1000, 20000, (rows, width), device=dev, generator=gen)
        lengths = torch.randint(max(1, width // 2), width + 1, (rows,), device=dev, generator=gen)
        lengths[0] = width
        padded = (torch.arange(width, device=dev) < lengths[:, None])[:, None, None, :]
        for masked in (False, True):
            for name, chosen in backends.items():

                def call(x: Any = ids, m: Any = padded if masked else None, chosen: Any = chosen) -> None:
                    ctx = sdpa_kernel(chosen) if chosen else contextlib.nullcontext()
                    with torch.inference_mode(), ctx:
                        model(input_ids=x, attention_mask=m)

                for _ in range(3):
                    call()
                _sync()
                issue, latency = [], []
                for _ in range(5):
                    t0 = time.perf_counter()
                    call()
                    t1 = time.perf_counter()
                    _sync()
                    issue.append(t1 - t0)
                    latency.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                _sync()
                per_call = (time.perf_counter() - t0) / reps
                row = {
                    "rows": rows,
                    "width": width,
                    "mask": masked,
                    "attention": name,
                    "issue_ms": 1e3 * float(np.median(issue)),
                    "latency_ms": 1e3 * float(np.median(latency)),
                    "per_call_ms": 1e3 * per_call,
                    "padded_tokens_per_s": rows * width / per_call,
                }
                out.append(row)
                log(
                    f"[forward] {rows:5d} x {width:3d} mask={masked!s:5} {name:13s} issue {row['issue_ms']:6.2f} ms "
                    f"latency {row['latency_ms']:7.2f} ms  per call {row['per_call_ms']:7.2f} ms  "
                    f"{row['padded_tokens_per_s'] / 1e6:5.2f}M tok/s"
                )
    return out


# -- flow fitting and calibrator overhead -------------------------------------------------------------------


def bench_flow_fit(
    X: np.ndarray,
    *,
    device: str,
    max_steps: int | None = None,
    cuda_graph: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Seconds to fit ``FlowCalibrator()`` (the official code's flow, 1 epoch, batch 64) on ``X`` [N, D], timed
    from the host array to the fitted flow (setup, copy to the device and every step included).

    With ``max_steps`` only that many steps run, and the epoch time is extrapolated from the time per step.
    """
    from .calibrators import FlowCalibrator

    cal = FlowCalibrator(device=device, max_steps=max_steps, cuda_graph=cuda_graph)
    _sync()
    start = time.perf_counter()
    cal.fit(X)
    _sync()
    seconds = time.perf_counter() - start
    epoch_steps = math.ceil(len(X) / 64)
    out = {
        "rows": int(X.shape[0]),
        "dim": int(X.shape[1]),
        "device": device,
        "cuda_graph": bool(cuda_graph and device.startswith("cuda")),
        "steps": int(cal.n_steps_),
        "seconds": seconds,
        "ms_per_step": 1e3 * seconds / cal.n_steps_,
        "epoch_steps": epoch_steps,
        "epoch_seconds_estimate": seconds / cal.n_steps_ * epoch_steps,
    }
    log(
        f"[flow fit] {X.shape[0]} x {X.shape[1]} on {device}{' (CUDA graph)' if out['cuda_graph'] else ''}: "
        f"{cal.n_steps_} steps in {seconds:.2f} s ({out['ms_per_step']:.2f} ms/step; one epoch = {epoch_steps} "
        f"steps ~ {out['epoch_seconds_estimate']:.1f} s)"
    )
    return out


def bench_flow_fit_gpu(
    X: np.ndarray,
    *,
    device: str = "cuda",
    probe_steps: int = 1000,
    rounds: int = 2,
    full_epoch: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The GPU flow-fitting benchmark: one whole epoch of ``FlowCalibrator()`` on ``X`` (the target: 1M x 768 in
    under 60 s), the training loop with and without its CUDA graph side by side (``probe_steps`` steps each,
    alternated ``rounds`` times, medians), and whether the two loops give bit-identical flows (300 steps on
    50,000 rows, with a held-out split)."""
    from .calibrators import FlowCalibrator

    FlowCalibrator(device=device, max_steps=5).fit(X[:4096])  # CUDA context, cuBLAS handles: not timed
    runs: dict[str, list[dict[str, Any]]] = {"cuda_graph": [], "eager": []}
    for _ in range(rounds):
        for name in runs:
            runs[name].append(
                bench_flow_fit(X, device=device, max_steps=probe_steps, cuda_graph=name == "cuda_graph", log=log)
            )
    out: dict[str, Any] = {
        name: {"ms_per_step": float(np.median([r["ms_per_step"] for r in rs])), "runs": rs} for name, rs in runs.items()
    }
    out["eager / cuda_graph"] = out["eager"]["ms_per_step"] / out["cuda_graph"]["ms_per_step"]
    log(f"[flow fit] eager / CUDA graph time per step: {out['eager / cuda_graph']:.2f}x")
    small = X[:50_000]
    a = FlowCalibrator(device=device, max_steps=300, validation_fraction=0.1, cuda_graph=False).fit(small)
    b = FlowCalibrator(device=device, max_steps=300, validation_fraction=0.1, cuda_graph=True).fit(small)
    identical = all(
        torch.equal(u, v) for u, v in zip(a.flow_.state_dict().values(), b.flow_.state_dict().values(), strict=True)
    )
    out["graph_equals_eager"] = {
        "identical_parameters": identical,
        "identical_history": a.history_ == b.history_,
        "max_abs_latent_diff": float(np.abs(a.transform(small[:2048]) - b.transform(small[:2048])).max()),
    }
    log(f"[flow fit] CUDA graph vs eager after 300 steps: {out['graph_equals_eager']}")
    if full_epoch:
        out["epoch"] = bench_flow_fit(X, device=device, log=log)
    return out


def bench_calibrator_overhead(
    encoder: Any,
    sentences: Sequence[str],
    *,
    flow_steps: int = 200,
    rounds: int = 3,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """What calibration adds to encoding: ``Embedder.encode`` (encoder + calibrator, which runs on the encoder's
    device before the copy to the host) against ``SentenceEncoder.encode`` alone, interleaved ``rounds`` times
    (medians), for a flow and a whitening fitted on the sentences' embeddings. End-to-end timings of a GPU host
    vary by tens of percent from run to run, so the work calibration adds is also measured on its own: the torch
    transform applied to the same rows on the device, in the encoder's chunk sizes. Also reported: the time of the
    host-side ``calibrator.transform`` on the same rows, as a share of encoding, and the largest difference
    between ``Embedder.encode`` and ``calibrator.transform(encoder.encode(...))``. The flow is fitted for only
    ``flow_steps`` steps: its transform costs the same however long it trained.
    """
    from .calibrators import FlowCalibrator, WhiteningCalibrator
    from .embedder import Embedder

    device = str(encoder.device)
    X = encoder.encode(sentences)
    X_device = torch.from_numpy(X).to(device)
    cals = {
        "flow": FlowCalibrator(device=device, max_steps=flow_steps).fit(X),
        "whitening": WhiteningCalibrator().fit(X),
    }
    out: dict[str, Any] = {"rows": len(sentences), "device": device}
    probe = list(sentences[:2048])
    for name, cal in cals.items():
        embedder = Embedder(encoder, cal)
        diff = float(np.abs(embedder.encode(probe) - cal.transform(encoder.encode(probe))).max())
        times = interleave(
            {"encoder": lambda: encoder.encode(sentences), "embedder": lambda e=embedder: e.encode(sentences)}, rounds
        )
        # Timed apart: a large numpy product leaves BLAS threads spinning, which would slow the next encode.
        times.update(interleave({"host_transform": lambda c=cal: c.transform(X)}, rounds))
        plain, calibrated, host = (float(np.median(times[k])) for k in ("encoder", "embedder", "host_transform"))
        # The work calibration adds on the device: the torch transform on the same rows, in the encoder's chunks.
        fn = cal.torch_transform(device)

        def on_device(fn=fn) -> None:
            for part in X_device.split(65536 if device.startswith("cuda") else 16384):
                fn(part)

        on_device()
        work = float(np.median(interleave({"t": on_device}, 2 * rounds + 1)["t"]))
        out[name] = {
            "encode_seconds": plain,
            "embedder_encode_seconds": calibrated,
            "overhead": calibrated / plain - 1,
            "device_transform_seconds": work,
            "device_transform_share_of_encoding": work / plain,
            "host_transform_seconds": host,
            "host_transform_share_of_encoding": host / plain,
            "max_abs_diff_to_transform": diff,
        }
        log(
            f"[calibrator] {name}: SentenceEncoder.encode {plain:.3f} s, Embedder.encode {calibrated:.3f} s "
            f"({100 * (calibrated / plain - 1):+.2f}%); the transform alone on the device {1e3 * work:.2f} ms "
            f"({100 * work / plain:.2f}% of encoding); host-side transform {host:.3f} s "
            f"({100 * host / plain:.1f}% of encoding); max |diff| to transform() {diff:.2e}"
        )
    return out


# -- memory -------------------------------------------------------------------------------------------------


#: What ``bertflow encode FILE -o OUT --model M --device D`` does (cli/core.py), for machines without typer.
_STREAM_SCRIPT = """
import json, sys
import numpy as np
from bertflow.io.text import iter_lines
from bertflow.encoding.encoder import SentenceEncoder
from bertflow.validation import check_finite
path, out, model, device = sys.argv[1:5]
enc = SentenceEncoder(model or None, device=device or None)
n = sum(1 for _ in iter_lines(path))
arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, enc.dim))
row = 0
for part in enc.iter_encode((text for _, text in iter_lines(path)), batch_size=128):
    check_finite(part, what="embeddings")
    arr[row : row + len(part)] = part
    row += len(part)
arr.flush()
print(json.dumps({"output": out, "rows": n, "dim": enc.dim}))
"""


def _children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (the tokenisation workers of an encoder), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _pss_kb(pid: int) -> int:
    """Proportional set size of a process (kB): its private pages plus its share of pages it shares."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _watch_memory(pid: int, stop: threading.Event, peak: dict[str, int]) -> None:
    """Poll /proc/PID/status for resident memory (kB), keeping the maxima: anonymous, file-backed, total; and the
    summed proportional set size of its child processes (forked workers share most pages with their parent)."""
    keys = {
        "RssAnon:": "anon_kb",
        "RssFile:": "file_kb",
        "RssShmem:": "shmem_kb",
        "VmRSS:": "rss_kb",
        "VmHWM:": "hwm_kb",
        "VmPin:": "pinned_kb",
        "VmLck:": "locked_kb",
    }
    polls = 0
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    parts = line.split()
                    if parts and parts[0] in keys:
                        name = keys[parts[0]]
                        peak[name] = max(peak.get(name, 0), int(parts[1]))
        except (FileNotFoundError, ProcessLookupError):
            return
        if polls % 5 == 0:  # smaps_rollup walks page tables: every 250 ms is enough
            children = _children(pid)
            peak["workers"] = max(peak.get("workers", 0), len(children))
            peak["workers_pss_kb"] = max(peak.get("workers_pss_kb", 0), sum(map(_pss_kb, children)))
        polls += 1
        stop.wait(0.05)


def bench_memory(
    lines: int,
    model: str | None,
    workdir: str | Path,
    *,
    source: Sequence[str],
    device: str | None = None,
    extra_args: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``bertflow encode`` on a generated ``lines``-line file in a subprocess; report its peak memory.

    Peak RSS is the child's own high-water mark (``VmHWM``) and its split into anonymous memory (what the
    process allocated), file-backed pages (libraries, and the output .npy memory map: page cache the kernel
    can drop) and shared/pinned memory, all polled from ``/proc/PID/status`` every 50 ms.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    text = workdir / f"lines-{lines}.txt"
    out = workdir / f"lines-{lines}.npy"
    with text.open("w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(source[i % len(source)] + "\n")
    import importlib.util

    if importlib.util.find_spec("typer") is not None:
        runner = "bertflow encode (CLI)"
        cmd = [sys.executable, "-m", "bertflow", "encode", str(text), "-o", str(out), "--quiet"]
        if model:
            cmd += ["--model", model]
        if device:
            cmd += ["--device", device]
        cmd += list(extra_args)
    else:  # no typer (a bare GPU image): the same streaming loop as the CLI's encode command
        runner = "the CLI's encode loop as a script (typer missing)"
        cmd = [sys.executable, "-c", _STREAM_SCRIPT, str(text), str(out), model or "", device or ""]
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    with open(workdir / "stdout.txt", "w+") as out_f, open(workdir / "stderr.txt", "w+") as err_f:
        proc = subprocess.Popen(cmd, env=env, stdout=out_f, stderr=err_f, text=True)
        peak: dict[str, int] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_memory, args=(proc.pid, stop, peak), daemon=True)
        watcher.start()
        # wait4 gives this child's own peak RSS (ru_maxrss, kB on Linux), unlike RUSAGE_CHILDREN's running max.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        watcher.join()
        seconds = time.perf_counter() - start
        out_f.seek(0)
        err_f.seek(0)
        stdout, stderr = out_f.read(), err_f.read()
    if proc.returncode != 0:
        raise RuntimeError(f"bertflow encode failed ({proc.returncode}): {stderr[-2000:]}")
    result = {
        "lines": lines,
        "runner": runner,
        "command": " ".join(cmd) if runner.startswith("bertflow") else runner,
        "seconds": seconds,
        "lines_per_s": lines / seconds,
        # The process's own peak (VmHWM, last read before it exited). wait4's ru_maxrss also counts the moments
        # between fork and exec, when the child is a copy of this (large) benchmark process.
        "peak_rss_mb": peak.get("hwm_kb", 0) / 1024,
        "ru_maxrss_mb": usage.ru_maxrss / 1024,
        "peak_anon_mb": peak.get("anon_kb", 0) / 1024,
        "peak_file_mb": peak.get("file_kb", 0) / 1024,
        "peak_shmem_mb": peak.get("shmem_kb", 0) / 1024,
        "peak_pinned_mb": max(peak.get("pinned_kb", 0), peak.get("locked_kb", 0)) / 1024,
        "worker_processes": peak.get("workers", 0),
        "peak_workers_pss_mb": peak.get("workers_pss_kb", 0) / 1024,
        "output_mb": out.stat().st_size / 2**20,
        "stdout": stdout.strip()[-500:],
    }
    log(
        f"[memory] bertflow encode {lines:,} lines: {seconds:.1f} s, peak RSS {result['peak_rss_mb']:.0f} MB "
        f"(anonymous {result['peak_anon_mb']:.0f} MB, file-backed {result['peak_file_mb']:.0f} MB, shared "
        f"{result['peak_shmem_mb']:.0f} MB, pinned {result['peak_pinned_mb']:.0f} MB; "
        f"{result['worker_processes']} tokenisation workers, {result['peak_workers_pss_mb']:.0f} MB PSS together; "
        f"output {result['output_mb']:.0f} MB)"
    )
    text.unlink()
    out.unlink()
    return result


def save_json(results: dict[str, Any], path: str | Path) -> None:
    """Write results as indented JSON (atomically: a partial run never leaves a broken file)."""
    from .io.files import atomic_write_text

    atomic_write_text(path, json.dumps(results, indent=1, default=str))


# -- suites -------------------------------------------------------------------------------------------------

#: Sizes of :func:`run_suite`: "full" for a GPU, "tiny" to check the benchmark code itself in seconds on a CPU.
SUITE_SCALES: dict[str, dict[str, Any]] = {
    "full": {
        "models": ("bert-base", "minilm-l6"),
        "sts": 40_000,
        "long": 8_000,
        "rounds": 5,
        "st_rounds": 3,
        "st_batch_sizes": (32, 256),
        "fit_rows": 1_000_000,
        "memory_lines": (200_000, 1_000_000),
    },
    "tiny": {
        "models": ("tiny",),
        "sts": 300,
        "long": 30,
        "rounds": 2,
        "st_rounds": 1,
        "st_batch_sizes": (32,),
        "fit_rows": 4_000,
        "memory_lines": (500, 2_000),
    },
}

#: bertflow settings timed besides the default in :func:`run_suite` (what each technique buys).
SUITE_VARIANTS: dict[str, dict[str, Any]] = {
    "cuDNN attention allowed (torch default)": {"cudnn_attention": True},
    "1 tokenisation thread": {"tokenize_workers": 1},
    "no tokenisation thread": {"tokenize_workers": 0},
    "no worker processes (tokenise in-process)": {"tokenize_processes": 0},
    "min_tokens=0 (smaller batches)": {"min_tokens": 0},
    "min_length_ratio=0 (padding unbounded)": {"min_length_ratio": 0.0},
    "max_tokens=16384": {"max_tokens": 16384},
    "batch_size=128 rows cap": {"batch_size": 128},
}


def run_suite(
    tokenizer_dir: str | Path,
    workdir: str | Path,
    out_json: str | Path,
    *,
    data_dir: str | Path | None = None,
    device: str = "cuda",
    scale: str = "full",
    deadline_s: float = 540.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Everything for one GPU lease, in one call: encoding against sentence-transformers (random-weight
    BERT-base and MiniLM-L6, STS and long texts, plus the variants), bf16 against fp32, memory of
    ``bertflow encode``, flow fitting on 1M vectors, calibrator overhead.

    Results are written to ``out_json`` after every section, so a run stopped by its time limit keeps what it
    finished; optional parts are skipped once ``deadline_s`` seconds have passed.
    """
    from .encoding.encoder import SentenceEncoder

    started = time.perf_counter()
    sizes = SUITE_SCALES[scale]
    workdir = Path(workdir)
    results: dict[str, Any] = {"environment": environment(device), "scale": scale, "errors": {}}

    def left() -> float:
        return deadline_s - (time.perf_counter() - started)

    def section(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - a benchmark section failing must not lose the others
            import traceback

            results["errors"][name] = traceback.format_exc()
            log(f"[{name}] FAILED: {e!r}")
        log(f"[{name}] {time.perf_counter() - t0:.1f} s (total {time.perf_counter() - started:.0f} s)")
        save_json(results, out_json)
        return results.get(name)

    try:
        base = sts_sentences(data_dir)
        results["text_source"] = f"STS12-16, STS-B, SICK-R distinct sentences ({len(base)})"
    except Exception:  # noqa: BLE001 - no data folder: synthetic STS-like text
        base = synthetic_sentences(30_000)
        results["text_source"] = "synthetic STS-like sentences (no STS data found)"
    datasets = {
        "sts": (replicate(base, sizes["sts"]), 64),
        "long": (long_texts(base, sizes["long"]), 256),
    }
    paths = {arch: build_random_model(arch, tokenizer_dir, workdir / arch) for arch in sizes["models"]}
    peak = H100_BF16_PEAK if device.startswith("cuda") else None

    for arch, path in paths.items():
        section(
            f"encode_{arch}",
            lambda p=str(path): bench_encode(
                p,
                datasets,
                device=device,
                st_batch_sizes=sizes["st_batch_sizes"],
                rounds=sizes["rounds"],
                st_rounds=sizes["st_rounds"],
                peak_flops=peak,
                variants=SUITE_VARIANTS,
                variant_rounds=2,
                log=log,
            ),
        )

    big = paths[sizes["models"][0]]
    if device.startswith("cuda"):
        shapes = [(4096, 16), (680, 15), (128, 16), (256, 128)]
        section(
            "forward",
            lambda: {arch: bench_forward(str(p), shapes, device=device, log=log) for arch, p in paths.items()},
        )

    def precision() -> dict[str, Any]:
        probe = datasets["sts"][0][:4096]
        low = SentenceEncoder(str(big), device=device).encode(probe).astype(np.float64)
        ref = SentenceEncoder(str(big), device=device, dtype="float32").encode(probe).astype(np.float64)
        rel = np.linalg.norm(low - ref, axis=1) / np.linalg.norm(ref, axis=1)
        half = len(probe) // 2

        def pair_cos(x: np.ndarray) -> np.ndarray:
            a, b = x[:half], x[half : 2 * half]
            return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

        out = {
            "rows": len(probe),
            "rel_l2_max": float(rel.max()),
            "rel_l2_mean": float(rel.mean()),
            "pair_cosine_abs_diff_max": float(np.abs(pair_cos(low) - pair_cos(ref)).max()),
        }
        log(f"[precision] default (bf16 on CUDA) vs float32: {out}")
        return out

    section("precision", precision)

    def overhead() -> dict[str, Any]:
        encoder = SentenceEncoder(str(big), device=device)
        return bench_calibrator_overhead(encoder, datasets["sts"][0], rounds=5, log=log)

    if left() > 45:
        section("calibrator_overhead", overhead)

    def flow_fit() -> dict[str, Any]:
        X = np.random.default_rng(0).normal(size=(sizes["fit_rows"], 768)).astype(np.float32)
        return bench_flow_fit_gpu(X, device=device, probe_steps=min(1000, math.ceil(len(X) / 64)), log=log)

    if left() > 30:
        section("flow_fit", flow_fit)
    if left() > 60:
        small = paths[sizes["models"][-1]]
        section(
            "memory",
            lambda: [
                bench_memory(
                    n,
                    str(small),
                    workdir / "memory",
                    source=base,
                    device=device,
                    extra_args=("--batch-size", "65536"),  # the CLI's default row cap (128) starves a GPU
                    log=log,
                )
                for n in sizes["memory_lines"]
            ],
        )

    results["wall_seconds"] = time.perf_counter() - started
    save_json(results, out_json)
    return results


#: bertflow settings timed besides the default in :func:`cpu_comparison` (why the CPU token budget is what it is).
CPU_VARIANTS: dict[str, dict[str, Any]] = {
    "max_tokens=1024": {"max_tokens": 1024},
    "max_tokens=8192, min_tokens=4096 (the earlier default)": {"max_tokens": 8192, "min_tokens": 4096},
}


def cpu_comparison(
    out_json: str | Path | None = None,
    *,
    sentences: int = 1000,
    long: int = 100,
    rounds: int = 5,
    data_dir: str | Path | None = None,
    cache_dir: str | Path = ".cache/bench",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The CPU benchmark: default model (all-MiniLM-L6-v2, fp32) against sentence-transformers, STS-B flow
    fitting time and calibrator overhead, on whatever cores this machine has.

    ``sentences`` STS sentences (a seeded sample) and ``long`` paragraph texts (max_length 256) are encoded by
    both, ``rounds`` times each, interleaved.
    """
    from .encoding.encoder import SentenceEncoder, resolve_model
    from .evaluation.datasets import load_sts_task

    _, path = resolve_model(None)
    base = sts_sentences(data_dir)
    results: dict[str, Any] = {"environment": environment("cpu")}
    datasets = {
        "sts": (replicate(base, sentences, seed=1), 64),
        "long": (long_texts(base, long, seed=1), 256),
    }
    results["encode"] = bench_encode(
        path,
        datasets,
        device="cpu",
        st_batch_sizes=(32,),
        rounds=rounds,
        st_rounds=rounds,
        variants=CPU_VARIANTS,
        variant_rounds=3,
        log=log,
    )
    if out_json:
        save_json(results, out_json)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    target = load_sts_task("STS-B", data_dir).fit_sentences("target")
    emb_file = cache / f"stsb-target-{len(target)}-minilm.npy"
    if emb_file.exists():
        X = np.load(emb_file)
    else:
        log(f"[flow fit] encoding the {len(target)} STS-B target sentences once (cached in {emb_file})")
        X = SentenceEncoder(device="cpu").encode(target)
        np.save(emb_file, X)
    fits = [bench_flow_fit(X, device="cpu", log=log) for _ in range(3)]
    results["flow_fit_stsb"] = {"runs": fits, "median_seconds": float(np.median([f["seconds"] for f in fits]))}
    encoder = SentenceEncoder(device="cpu")
    results["calibrator_overhead"] = bench_calibrator_overhead(encoder, datasets["sts"][0], rounds=rounds, log=log)
    if out_json:
        save_json(results, out_json)
    return results
