"""A calibrator's torch transform made cheap to call on a GPU: one CUDA graph replay per chunk of vectors.

A flow's :meth:`Calibrator.torch_transform` is a few hundred small torch operations, whose launches from Python,
not their kernels, cost ``Embedder.encode`` several percent (docs/performance.md). :func:`fast_torch_transform`
captures the transform as a CUDA graph per input shape and replays it: one launch per chunk, the same kernels, the
same bits. A shape is captured the second time it is seen (a size seen once, like the last chunk of a one-off
corpus, never pays for a capture) and a small least-recently-used cache keeps the graphs.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from typing import Any

import torch

from ..typing import TorchTransform
from .base import Calibrator

logger = logging.getLogger(__name__)

#: Graphs kept per transform. The encoder's chunk ramp has 5 sizes plus a remainder; each graph holds its input
#: and output buffers (2 x rows x D float32: 400 MB for a 65,536-row chunk of 768-d vectors) on the GPU.
DEFAULT_MAX_GRAPHS = 8

#: Shapes whose sightings are counted at most; past this the counts restart (keeps a long-lived transform fed
#: with ever-new sizes from growing without bound).
_MAX_COUNTED = 256

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
            if isinstance(found, GraphedTransform) and found.max_graphs == max_graphs:
                return found
        fast = GraphedTransform(calibrator.torch_transform(device), device, max_graphs=max_graphs)
        _MEMO[calibrator][device] = (state, fast)
        return fast


class GraphedTransform:
    """A torch transform replayed from one CUDA graph per input shape (rows, D).

    A shape runs eagerly the first time it is seen; the second time its graph is captured (after a warm-up run
    on a side stream, as ``torch.cuda.graphs`` recommends) and from then on each call is: copy the input into the
    graph's static buffer, replay, clone the static output. All graphs share one memory pool, which is safe
    because replays never overlap: calls are serialised by a lock and ordered on the GPU by an event, also when
    they come from different threads or streams. Inputs that a graph cannot take (not on this device, not 2-D,
    empty, needing autograd, or during another capture) run eagerly. ``fn`` is the eager transform (float32 [n, D]
    -> [n, D_out]), ``max_graphs`` the shapes kept captured (least recently used dropped first).
    """

    def __init__(self, fn: TorchTransform, device: str | torch.device, *, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self.fn = fn
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"GraphedTransform needs a CUDA device, got {device}")
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = (
            OrderedDict()
        )
        self._seen: dict[tuple[int, ...], int] = {}
        self._failed = False
        self._lock = threading.Lock()
        self._pool: Any = None
        self._done: torch.cuda.Event | None = None

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Input shapes captured now, least recently used first."""
        return list(self._graphs)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self._failed
            or x.device != self.device
            or x.dim() != 2
            or x.shape[0] == 0
            or (x.requires_grad and torch.is_grad_enabled())
            or torch.cuda.is_current_stream_capturing()
        ):
            return self.fn(x)
        key = tuple(x.shape)
        with self._lock:
            graph = self._graphs.get(key)
            if graph is None:
                seen = self._seen.get(key, 0) + 1
                if seen < 2:
                    if len(self._seen) >= _MAX_COUNTED:
                        self._seen.clear()
                    self._seen[key] = seen
                    return self.fn(x)
                graph = self._capture(x)
                if graph is None:
                    return self.fn(x)
            self._graphs.move_to_end(key)
            g, static_in, static_out = graph
            stream = torch.cuda.current_stream(self.device)
            if self._done is not None:  # the previous replay (maybe on another stream) is done with the buffers
                stream.wait_event(self._done)
            with torch.inference_mode():
                static_in.copy_(x)
                g.replay()
            with torch.no_grad():  # a normal tensor, also outside inference mode; the next replay overwrites static_out
                out = static_out.clone()
            if self._done is None:
                self._done = torch.cuda.Event()
            self._done.record(stream)
            return out

    def _capture(self, x: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor] | None:
        """Capture the transform for ``x``'s shape; ``None`` (and eager from then on) if capture fails."""
        if len(self._graphs) >= self.max_graphs and self._done is not None:
            self._done.synchronize()  # no graph is destroyed, nor its buffers reused, while its replay runs
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)  # its buffers go back to the shared pool for the next capture
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(self.device)
        if self._done is not None:
            current.wait_event(self._done)
        try:
            with torch.inference_mode():
                static_in = torch.empty(x.shape, dtype=torch.float32, device=self.device)
                static_in.copy_(x)
                side = torch.cuda.Stream(device=self.device)
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    self.fn(static_in)  # warm-up: lazy initialisation and cuBLAS workspaces stay out of the graph
                current.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: the encoder's tokenisation threads allocate pinned memory meanwhile, which a
                # global capture would refuse.
                with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                    static_out = self.fn(static_in)
        except RuntimeError as e:  # an operation that cannot be captured (a host sync, a CPU round trip)
            logger.warning("calibrator transform: CUDA graph capture failed (%s); running it eagerly", e)
            torch.cuda.synchronize(self.device)
            self._failed = True
            self._graphs.clear()
            return None
        entry = (graph, static_in, static_out)
        self._graphs[tuple(x.shape)] = entry
        self._seen.pop(tuple(x.shape), None)
        return entry


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
