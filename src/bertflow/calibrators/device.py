"""A calibrator's torch transform made cheap to call on a GPU: one CUDA graph replay per chunk of vectors.

A flow's :meth:`Calibrator.torch_transform` is a few hundred small torch operations, whose launches from Python,
not their kernels, cost ``Embedder.encode`` several percent (docs/performance.md). :func:`fast_torch_transform`
captures the transform as a CUDA graph per input shape and replays it: one launch per chunk, the same kernels, the
same bits. A shape is captured the second time it is seen (a size seen once, like the last chunk of a one-off
corpus, never pays for a capture) and a small least-recently-used cache keeps the graphs.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ..cuda_graphs import GraphedFunction
from ..typing import TorchTransform
from .base import Calibrator

#: Graphs kept per transform. The encoder's chunk ramp has 5 sizes plus a remainder; each graph holds its input
#: and output buffers (2 x rows x D float32: 400 MB for a 65,536-row chunk of 768-d vectors) on the GPU.
DEFAULT_MAX_GRAPHS = 8

# One fast transform per (calibrator, device), rebuilt when the calibrator is refitted (see _fitted_state).
_MEMO: weakref.WeakKeyDictionary[Calibrator, dict[torch.device, tuple[tuple[Any, ...], TorchTransform]]] = (
    weakref.WeakKeyDictionary()
)
_MEMO_LOCK = threading.Lock()


def fast_torch_transform(
    calibrator: Calibrator, device: str | torch.device, *, max_graphs: int = DEFAULT_MAX_GRAPHS
) -> TorchTransform:
    """``calibrator.torch_transform(device)``, replayed from CUDA graphs on a CUDA device.

    Same contract as :meth:`Calibrator.torch_transform` (float32 [n, D] -> float32 [n, D_out]) and bit-identical
    results. On CUDA the returned function is memoised per calibrator and device, so calling this once per
    ``encode`` reuses the graphs; refitting the calibrator gives a new one. Off CUDA, with ``max_graphs=0`` (the
    input shapes kept captured at once), and for calibrators whose transform goes through numpy, it is the plain
    ``torch_transform``.
    """
    device = torch.device(device)
    if device.type != "cuda" or max_graphs < 1 or not _native(calibrator):
        return calibrator.torch_transform(device)
    if device.index is None:  # one memo entry for "cuda" and "cuda:0"; x.device always carries the index
        device = torch.device("cuda", torch.cuda.current_device())
    state = _fitted_state(calibrator)
    with _MEMO_LOCK:
        entry = _MEMO.setdefault(calibrator, {}).get(device)
        if entry is not None and _same(entry[0], state):
            found = entry[1]
            if isinstance(found, GraphedFunction) and found.max_graphs == max_graphs:
                return found
        fast = graphed_transform(calibrator.torch_transform(device), device, max_graphs=max_graphs)
        _MEMO[calibrator][device] = (state, fast)
        return fast


def graphed_transform(
    fn: TorchTransform, device: str | torch.device, *, max_graphs: int = DEFAULT_MAX_GRAPHS
) -> GraphedFunction:
    """``fn`` (float32 [n, D] -> [n, D_out]) replayed from CUDA graphs on ``device``: an input shape is captured the
    second time it is seen, inputs are cast to float32 (:class:`~bertflow.cuda_graphs.GraphedFunction`)."""
    return GraphedFunction(fn, device, max_graphs=max_graphs, capture_at=2, name="calibrator transform")


def _native(calibrator: Calibrator) -> bool:
    """Whether the calibrator's torch transform stays on the device (no numpy round trip, which no graph can
    hold), for a chain also every step's."""
    if type(calibrator)._torch_transform is Calibrator._torch_transform:
        return False
    return all(_native(step) for step in getattr(calibrator, "steps_", ()))


def _fitted_state(calibrator: Calibrator) -> tuple[Any, ...]:
    """The objects of the calibrator's fitted attributes (``name_``), steps' too: ``fit`` replaces them."""
    state: list[Any] = [v for k, v in sorted(vars(calibrator).items()) if k.endswith("_") and not k.startswith("_")]
    for step in getattr(calibrator, "steps_", ()):
        state.extend(_fitted_state(step))
    return tuple(state)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
