"""CUDA graphs of the unpadded forward (issue 23): a batch's ~75 kernel launches replayed as one.

On a GPU, MiniLM-L6's unpadded forward of a 65,536-token batch runs in about 5 ms of device time, and queueing its
kernels (plus the packing and the pooling) from Python takes about as long, with the GIL held: the threads that
tokenise and pack the next chunks wait for it (docs/performance.md). A CUDA graph records the launches of one
batch shape once; a replay queues them all in about 0.1 ms.

Shapes: one graph per width (tokens per row, the batch's longest sentence) and plan, for ``budget // width`` rows,
the rows of a full token-budget batch. A batch of that width with at least half as many rows is copied into the
graph's static input, the rows after its own made empty (length 0: in the slotted layout an empty row's slots
attend to themselves only, and its pooled vector is dropped), and its own rows of the output are returned; other
batches run eagerly. Graphs are recorded when the encoder is loaded (:func:`.warmup.warm_up`, every width up to
``max_length``): recorded in the middle of a stream, they slowed its first passes (memory pools growing while
batches run, docs/performance.md). They suit models whose batches are full anyway (the batch floor reaches the
token budget: MiniLM-L6); for BERT-base the empty rows add device time, which is what bounds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: ``compute(buffer, rows, width)``: pooled float32 vectors [rows, P x D] of a batch laid out as in
#: :class:`~bertflow.encoding.batching.HostBatch` (``buffer`` int32 on the device).
Compute = Callable[[torch.Tensor, int, int], torch.Tensor]


class BatchGraphs:
    """Recorded forwards of one model on ``device`` for batches of at most ``budget`` token slots (see the module
    docstring); ``params`` are the model's parameters, whose replacement or in-place change drops every graph."""

    def __init__(self, device: torch.device, budget: int, params: list[torch.Tensor]) -> None:
        self.device, self.budget, self.params = device, int(budget), params
        self.graphs: dict[tuple[Any, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.warmed = False  # whether the recording stream has run the forward eagerly
        self.signature = self._signature()

    def _signature(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.data_ptr(), p._version) for p in self.params)

    def rows(self, width: int) -> int:
        """Rows of the graph of ``width``: a full token-budget batch."""
        return max(1, self.budget // width)

    def check_weights(self) -> None:
        """Drop every graph if a parameter was replaced or changed in place since they were recorded (a graph reads
        the weights at the addresses it was recorded with; checked at every encode, and batches then run eagerly)."""
        signature = self._signature()
        if signature != self.signature:
            self.graphs.clear()
            self.signature = signature

    def run(self, key: Any, buffer: torch.Tensor, rows: int, width: int) -> torch.Tensor | None:
        """Pooled vectors [rows, P x D] of the batch in host ``buffer`` (``rows`` x ``width``, plan ``key``) from
        the graph of its width; ``None`` where there is none, or the batch has fewer than half its rows: run it
        eagerly."""
        entry = self.graphs.get((key, width))
        if entry is None or rows < self.rows(width) // 2:
            return None
        graph, static, out = entry
        self._fill(static, buffer, rows, width)
        graph.replay()
        return out[:rows]

    def _fill(self, static: torch.Tensor, buffer: torch.Tensor, rows: int, width: int) -> None:
        """Copy a host batch into a graph's static input; the rows after it get length 0."""
        full = self.rows(width)
        static[: rows * width].copy_(buffer[: rows * width], non_blocking=True)
        lengths = static[full * width :]
        lengths[:rows].copy_(buffer[rows * width :], non_blocking=True)
        lengths[rows:].zero_()

    def record(self, key: Any, width: int, compute: Compute) -> None:
        """Record the graph of ``width`` for plan ``key`` (its static input holding synthetic rows of ``width``
        tokens until a batch is copied in)."""
        full = self.rows(width)
        static = torch.zeros(full * width + full, dtype=torch.int32, device=self.device)
        static[full * width :] = width
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        for attempt in (1, 2):
            self.stream.wait_stream(current)
            if attempt == 2 or not self.warmed:
                # An eager run on the recording stream first (its cuBLAS workspace, lazily loaded kernels): once,
                # and again if a record failed.
                with torch.cuda.stream(self.stream):
                    compute(static, full, width)
                self.warmed = True
            current.wait_stream(self.stream)
            try:
                # thread_local: another thread's CUDA calls meanwhile (another encoder's pinned memory) are no error.
                with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                    out = compute(static, full, width)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                graph = torch.cuda.CUDAGraph()
        self.graphs[(key, width)] = (graph, static, out)
