"""One function replayed from CUDA graphs, one graph per input shape: the launches of many small kernels become one.

Two callers: a calibrator's torch transform (:func:`bertflow.calibrators.device.fast_torch_transform`, a few
hundred small operations per chunk) and the encoder's packed forward (:mod:`bertflow.encoding.graphs`, a hundred
kernels per batch, whose launches from Python bound a narrow model's throughput).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: Shapes whose sightings are counted at most; past this the counts restart (keeps a long-lived function fed
#: with ever-new sizes from growing without bound).
_MAX_COUNTED = 256


class GraphedFunction:
    """``fn`` (a 2-D tensor -> a tensor, on one CUDA device, no host sync inside) replayed from one CUDA graph per
    input shape.

    A shape runs eagerly until its ``capture_at``-th sighting (1: at once; 2: a size seen once, like the last chunk
    of a one-off corpus, never pays for a capture). That call captures ``fn``, after running it once on a side
    stream (lazy initialisation and cuBLAS workspaces stay out of the graph, as ``torch.cuda.graphs`` recommends; its
    result is the call's) if ``warm_up``, else only before the first capture (a capture then costs about one eager
    call). From then on each call is: copy the input into the graph's static buffer, replay, clone the static
    output. All graphs share one memory pool, which is safe because replays never overlap: calls
    are serialised by a lock and ordered on the GPU by an event, also when they come from different threads or
    streams. Inputs that a graph cannot take (not on this device, not 2-D, empty, needing autograd, or during
    another capture) run eagerly. ``max_graphs``: the shapes kept captured (least recently used dropped first);
    ``input_dtype``: the static input's dtype (inputs are cast to it; ``None``: each input's own, part of the key);
    ``name``: for the warning if a capture fails (the function then stays eager).
    """

    def __init__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        device: str | torch.device,
        *,
        max_graphs: int,
        capture_at: int = 2,
        warm_up: bool = True,
        input_dtype: torch.dtype | None = torch.float32,
        name: str = "function",
    ) -> None:
        self.fn = fn
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        if capture_at < 1:
            raise ValueError(f"capture_at must be at least 1, got {capture_at}")
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.max_graphs, self.capture_at, self.warm_up = max_graphs, capture_at, warm_up
        self.input_dtype, self.name = input_dtype, name
        self._graphs: OrderedDict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = (
            OrderedDict()
        )
        self._seen: dict[tuple[Any, ...], int] = {}
        self._failed = False
        self._lock = threading.Lock()
        self._pool: Any = None
        self._side: Any = None  # the stream of warm-ups and captures
        self._warmed = False
        self._done: torch.cuda.Event | None = None

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Input shapes captured now, least recently used first."""
        return [key[0] for key in self._graphs]

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
        key = self._key(x)
        with self._lock:
            stream = torch.cuda.current_stream(self.device)
            graph = self._graphs.get(key)
            out = None
            if graph is None:
                seen = self._seen.get(key, 0) + 1
                if seen < self.capture_at:
                    if len(self._seen) >= _MAX_COUNTED:
                        self._seen.clear()
                    self._seen[key] = seen
                    return self.fn(x)
                graph, out = self._capture(key, x)
                if graph is None:
                    return out if out is not None else self.fn(x)
            self._graphs.move_to_end(key)
            g, static_in, static_out = graph
            if out is None:
                if self._done is not None:  # the previous replay (maybe on another stream) is done with the buffers
                    stream.wait_event(self._done)
                with torch.inference_mode():
                    static_in.copy_(x)
                    g.replay()
                with torch.no_grad():  # a normal tensor, also outside inference mode; the next replay overwrites it
                    out = static_out.clone()
            self._record_done(stream)
            return out

    def close(self) -> None:
        """Drop every graph once the last replay is done (its buffers go back to the pool)."""
        with self._lock:
            if self._done is not None:
                self._done.synchronize()
            self._graphs.clear()

    def capture(self, x: torch.Tensor) -> None:
        """Capture the graph of ``x``'s shape now, if it is not captured (for a caller that knows the shapes to
        come; ``x``'s values only fill the static input)."""
        key = self._key(x)
        with self._lock:
            if key not in self._graphs and not self._failed:
                self._capture(key, x)
                self._record_done(torch.cuda.current_stream(self.device))

    def _key(self, x: torch.Tensor) -> tuple[Any, ...]:
        """The graph of ``x``: its shape and the static input's dtype."""
        return (tuple(x.shape), self.input_dtype or x.dtype)

    def _record_done(self, stream: Any) -> None:
        """Mark where the last use of the graphs' buffers ends on ``stream`` (the next replay or capture waits)."""
        if self._done is None:
            self._done = torch.cuda.Event()
        self._done.record(stream)

    def _capture(
        self, key: tuple[Any, ...], x: torch.Tensor
    ) -> tuple[tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
        """Capture the graph for ``key`` (``None``, and eager from then on, if capture fails), after a warm-up run of
        ``fn(x)`` on the side stream if ``warm_up`` asks (else only before this function's first capture): the
        graph, and the warm-up's result if it ran (``None``: replay the graph for it)."""
        if len(self._graphs) >= self.max_graphs and self._done is not None:
            self._done.synchronize()  # no graph is destroyed, nor its buffers reused, while its replay runs
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)  # its buffers go back to the shared pool for the next capture
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._side = torch.cuda.Stream(device=self.device)
        current, side = torch.cuda.current_stream(self.device), self._side
        if self._done is not None:
            current.wait_event(self._done)
        with torch.inference_mode():
            static_in = torch.empty(x.shape, dtype=key[1], device=self.device)
            static_in.copy_(x)
        side.wait_stream(current)
        out = None
        if self.warm_up or not self._warmed:
            # Lazy initialisation and cuBLAS workspaces stay out of the graph; the run is this call's result, in
            # inference mode only if the caller is (a tensor it may write to).
            with torch.no_grad(), torch.cuda.stream(side):
                out = self.fn(static_in)
            self._warmed = True
        try:
            with torch.inference_mode():
                graph = torch.cuda.CUDAGraph()
                # thread_local: the encoder's tokenisation threads allocate pinned memory meanwhile, which a
                # global capture would refuse.
                with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                    static_out = self.fn(static_in)
        except RuntimeError as e:  # an operation that cannot be captured (a host sync, a CPU round trip)
            logger.warning("%s: CUDA graph capture failed (%s); running it eagerly", self.name, e)
            torch.cuda.synchronize(self.device)
            self._failed = True
            self._graphs.clear()
            return None, out
        current.wait_stream(side)
        if out is not None:
            out.record_stream(current)  # made on the side stream, read on this one
        entry = (graph, static_in, static_out)
        self._graphs[key] = entry
        self._seen.pop(key, None)
        return entry, out
