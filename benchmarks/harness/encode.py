"""Encoding benchmarks: bertflow's encoder against ``SentenceTransformer.encode`` side by side, its settings
(:class:`~bertflow.encoding.settings.EncodeSettings`) as variants, the bare forward pass at fixed shapes, and what
calibration adds to encoding.

Model FLOP utilisation (MFU) counts the useful FLOPs only (real tokens, no padding) against a peak rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .common import interleave, model_flops, st_padded_tokens, sync

__all__ = ["bench_calibrator_overhead", "bench_encode", "bench_forward", "format_throughput", "throughput"]


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
        variants: extra bertflow settings to time, name -> overrides (fields of the encoder's
            :class:`~bertflow.encoding.settings.EncodeSettings`, and ``batch_size``), each timed ``variant_rounds``
            times after the comparison.
        check_agreement: also compare the two systems' vectors (cosine) on the first 512 sentences.

    Returns:
        ``{"datasets": {name: {"sentences", "real_tokens", "systems": {system: metrics}, "ratios"}}}``.
    """
    from sentence_transformers import SentenceTransformer

    from bertflow import SentenceEncoder
    from bertflow.encoding.device import resolve_dtype

    torch_dtype = resolve_dtype(dtype, torch.device(device))
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
            systems[side.name] = throughput(len(sentences), real, side.padded_tokens(), flops, side.times, peak_flops)
            if side.name == "bertflow":
                systems[side.name]["uniform_batches"] = encoder.last_stats.uniform_batches
                systems[side.name]["batches"] = encoder.last_stats.batches
            log(f"  {side.name:34s} {format_throughput(systems[side.name])}")
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
                log(f"  variant {vname:26s} {format_throughput(entry['variants'][vname])}")
        results["datasets"][ds_name] = entry
    return results


def _time_variant(
    encoder: Any,
    sentences: list[str],
    overrides: dict[str, Any],
    rounds: int,
    real: int,
    flops: float,
    peak: float | None,
) -> dict[str, Any]:
    """Time ``encoder`` with ``overrides`` applied to its settings (``batch_size`` goes to ``encode``), then put
    its settings back."""
    saved = encoder.settings
    encoder.settings = dataclasses.replace(saved, **{k: v for k, v in overrides.items() if k != "batch_size"})
    try:
        batch_size = overrides.get("batch_size")
        times = interleave({"v": lambda: encoder.encode(sentences, batch_size=batch_size)}, rounds)["v"]
        out = throughput(len(sentences), real, encoder.last_stats.padded_tokens, flops, times, peak)
        out["uniform_batches"], out["batches"] = encoder.last_stats.uniform_batches, encoder.last_stats.batches
        return out
    finally:
        encoder.settings = saved


def throughput(n: int, real: int, padded: int, flops: float, times: list[float], peak: float | None) -> dict[str, Any]:
    """Rates of ``n`` sentences (``real`` / ``padded`` tokens, ``flops`` useful FLOPs) timed ``times`` seconds:
    medians, padding efficiency, and MFU against ``peak`` FLOP/s when given."""
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


def format_throughput(m: dict[str, Any]) -> str:
    """One result line of :func:`throughput`'s rates."""
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

    from bertflow import SentenceEncoder

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
                sync()
                issue, latency = [], []
                for _ in range(5):
                    t0 = time.perf_counter()
                    call()
                    t1 = time.perf_counter()
                    sync()
                    issue.append(t1 - t0)
                    latency.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                sync()
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
    from bertflow import Embedder
    from bertflow.calibrators import FlowCalibrator, WhiteningCalibrator

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
