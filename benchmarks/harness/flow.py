"""Flow fitting benchmarks: ``FlowCalibrator()`` on an embedding matrix, and on a GPU its training loop with and
without the CUDA graph side by side (time per step, and whether both loops give identical flows)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .common import sync

__all__ = ["bench_flow_fit", "bench_flow_fit_gpu"]


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
    from bertflow.calibrators import FlowCalibrator

    cal = FlowCalibrator(device=device, max_steps=max_steps, cuda_graph=cuda_graph)
    sync()
    start = time.perf_counter()
    cal.fit(X)
    sync()
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
    50,000 rows, with a held-out split).

    Off CUDA there is no graph, so only the eager loop is timed (``"cuda_graph"`` is ``None``): comparing it with
    itself would print a ratio that measures nothing.
    """
    from bertflow.calibrators import FlowCalibrator

    FlowCalibrator(device=device, max_steps=5).fit(X[:4096])  # CUDA context, cuBLAS handles: not timed
    graph = device.startswith("cuda")
    runs: dict[str, list[dict[str, Any]]] = {"cuda_graph": [], "eager": []} if graph else {"eager": []}
    if not graph:
        log(f"[flow fit] no CUDA graph on {device}: timing the eager loop only")
    for _ in range(rounds):
        for name in runs:
            runs[name].append(
                bench_flow_fit(X, device=device, max_steps=probe_steps, cuda_graph=name == "cuda_graph", log=log)
            )
    out: dict[str, Any] = {
        name: {"ms_per_step": float(np.median([r["ms_per_step"] for r in rs])), "runs": rs} for name, rs in runs.items()
    }
    if graph:
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
    else:
        out["cuda_graph"] = None
    if full_epoch:
        out["epoch"] = bench_flow_fit(X, device=device, log=log)
    return out
