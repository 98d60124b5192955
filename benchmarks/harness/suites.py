"""The benchmark suites: everything for one GPU lease (:func:`run_suite`) and the CPU comparison
(:func:`cpu_comparison`), each writing its results file as it goes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    H100_BF16_PEAK,
    build_random_model,
    environment,
    long_texts,
    replicate,
    save_json,
    sts_sentences,
    synthetic_sentences,
)
from .encode import bench_calibrator_overhead, bench_encode, bench_forward
from .flow import bench_flow_fit, bench_flow_fit_gpu
from .memory import bench_memory

__all__ = ["CPU_VARIANTS", "SUITE_SCALES", "SUITE_VARIANTS", "cpu_comparison", "run_suite"]

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
    from bertflow import SentenceEncoder

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
    from bertflow import SentenceEncoder
    from bertflow.cli.evaluate import find_data_dir
    from bertflow.encoding.loading import resolve_model
    from bertflow.evaluation.datasets import load_sts_task

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
    target = load_sts_task("STS-B", find_data_dir(None if data_dir is None else Path(data_dir))).fit_sentences("target")
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
