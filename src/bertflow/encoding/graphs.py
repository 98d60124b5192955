"""The packed forward replayed from CUDA graphs: a batch's hundred kernel launches become one (issue 23).

A narrow model such as MiniLM-L6 is bound by the host: launching a batch's kernels from Python takes about as long
as the device takes to run them (docs/performance.md). Here a batch's real tokens are laid out on a tokenisation
thread in an int32 buffer whose shape depends only on a token bucket (:func:`layout`, :func:`bucket`), and
:class:`GraphForward` replays the packed forward (:class:`~bertflow.encoding.packed.PackedBert` with the fused
steps, attention by :func:`~bertflow.encoding.fused.grouped_attention`, pooling by
:func:`~bertflow.encoding.fused.segment_mean`) from one CUDA graph per bucket
(:class:`~bertflow.cuda_graphs.GraphedFunction`). The tokens past a batch's own, up to its bucket, are padding that
every layer runs on and nothing reads.

The layout, ``[4, T]`` int32 for a bucket of ``T`` tokens and up to ``R = T // 2`` sentences: row 0 the token ids
(the pad id after the last real token), row 1 each token's position in its sentence, rows 2-3 (``2T`` values) the
sentence starts ``cu`` [R + 1] (sentences past the batch's own are empty), the attention runs' class bounds
[len(GROUP_BLOCKS) + 1] and the runs ``(first, end)`` [R, 2] (:func:`attention_runs`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..cuda_graphs import GraphedFunction
from .fused import GROUP_BLOCKS, TILE_MAX, grouped_attention, segment_mean, tile_runs
from .packed import PackedBert
from .pooling import Pooling
from .pooling.layers import LayerMeanPooling
from .pooling.token import ClsPooling, PoolerPooling
from .settings import DEFAULT_GRAPH_TOKENS
from .tokenization import TokenArrays

#: Token buckets per doubling: powers of two, so that a process meets a few buckets, each captured once, whatever
#: its text (with 4 a step, first passes over new text met new buckets and paid their captures: docs/performance.md).
#: The full batches of a stream share one bucket; a chunk's last batch runs on up to twice its tokens.
STEPS_PER_OCTAVE = 1
#: The smallest bucket (tokens).
MIN_BUCKET = 1024
#: Buckets are multiples of this many tokens (the matrix products' tiles).
BUCKET_MULTIPLE = 256
#: Graphs kept per pooling plan (least recently used dropped first); each holds its input and output buffers.
MAX_GRAPHS = 16
#: Pooling plans whose graphs :class:`GraphForward` keeps (an encode call with explicit poolings makes a plan).
MAX_PLANS = 4
#: The poolings :class:`GraphForward` computes on packed tokens; a plan with another runs eagerly.
GRAPHED_POOLINGS = (LayerMeanPooling, ClsPooling, PoolerPooling)


def bucket(tokens: int) -> int:
    """The bucket of a batch of ``tokens`` real tokens: the smallest of ``MIN_BUCKET`` and the values
    ``2^(k / STEPS_PER_OCTAVE)`` rounded up to a multiple of ``BUCKET_MULTIPLE`` that holds them."""
    if tokens <= MIN_BUCKET:
        return MIN_BUCKET
    step = int(np.ceil(STEPS_PER_OCTAVE * np.log2(tokens))) - 1
    while True:
        size = -(-int(np.ceil(2.0 ** (step / STEPS_PER_OCTAVE))) // BUCKET_MULTIPLE) * BUCKET_MULTIPLE
        if size >= tokens:
            return size
        step += 1


def buckets_up_to(tokens: int) -> list[int]:
    """Every bucket from :data:`MIN_BUCKET` to ``bucket(tokens)``, ascending."""
    sizes = [MIN_BUCKET]
    while sizes[-1] < bucket(tokens):
        sizes.append(bucket(sizes[-1] + 1))
    return sizes


def attention_runs(lengths: np.ndarray, cu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs of :func:`~bertflow.encoding.fused.grouped_attention` for sentences of ``lengths`` tokens (int [n],
    each 1 .. TILE_MAX) starting at ``cu`` [n + 1]: ``(runs int32 [G, 2] token ranges (first, end), bounds int32
    [len(GROUP_BLOCKS) + 1])``, class ``c``'s runs being rows ``bounds[c] .. bounds[c + 1] - 1``. A sentence takes
    the smallest tile of :data:`GROUP_BLOCKS` that holds it; up to ``per`` consecutive sentences of the same tile
    and ``per`` (the power of two of times the longest fits) share a run (:func:`~bertflow.encoding.fused.tile_runs`,
    as for :func:`~bertflow.encoding.fused.segment_tiles`)."""
    n = len(lengths)
    block, per, run_start, run_end = tile_runs(lengths)
    first_of_run = np.repeat(run_start, run_end - run_start)
    starts = np.flatnonzero((np.arange(n) - first_of_run) % per == 0)
    ends = np.minimum(starts + per[starts], np.repeat(run_end, run_end - run_start)[starts])
    order = np.argsort(block[starts], kind="stable")  # class by class, in order within a class
    starts, ends = starts[order], ends[order]
    runs = np.stack([cu[starts], cu[ends]], axis=1).astype(np.int32)
    counts = [int((block[starts] == b).sum()) for b in GROUP_BLOCKS]
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return runs, bounds


def layout(tokens: TokenArrays, rows: np.ndarray, pad_id: int, pinned: bool = False) -> torch.Tensor | None:
    """The graph input of the sentences ``rows`` of ``tokens`` (in that order; a batch, longest first): int32
    ``[4, T]`` for their bucket ``T`` (module docstring), in pinned memory if ``pinned``; ``None`` where no graph
    takes them (a sentence over :data:`~bertflow.encoding.fused.TILE_MAX` tokens or of none, or more than ``T // 2``
    sentences)."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = tokens.offsets[rows]
    lengths = tokens.offsets[rows + 1] - starts
    n = len(rows)
    if n == 0 or lengths.max() > TILE_MAX or lengths.min() < 1:
        return None
    total = int(lengths.sum())
    size = bucket(total)
    width = size // 2
    if n > width:
        return None
    buffer = torch.empty((4, size), dtype=torch.int32, pin_memory=pinned)
    out = buffer.numpy()
    cu = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    sentence_start = np.repeat(cu[:-1], lengths)
    out[0, :total] = tokens.ids[np.repeat(starts, lengths) + np.arange(total) - sentence_start]
    out[0, total:] = pad_id
    out[1, :total] = np.arange(total) - sentence_start
    out[1, total:] = 0
    meta = out[2:].reshape(-1)  # a view: rows 2 and 3 are contiguous
    meta[: n + 1] = cu
    meta[n + 1 : width + 1] = total
    runs, bounds = attention_runs(lengths, cu)
    at = width + 1
    meta[at : at + len(bounds)] = bounds
    at += len(bounds)
    meta[at : at + runs.size] = runs.reshape(-1)
    meta[at + runs.size :] = 0
    return buffer


def unpack_layout(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids int64 [T], positions int64 [T], cu int32 [R + 1], bounds int32, runs int32 [R, 2])`` of a
    :func:`layout` ``x`` (views where the dtype allows)."""
    size = x.shape[1]
    width = size // 2
    meta = x[2:].reshape(-1)
    cu = meta[: width + 1]
    at = width + 1
    bounds = meta[at : at + len(GROUP_BLOCKS) + 1]
    at += len(GROUP_BLOCKS) + 1
    runs = meta[at : at + 2 * width].view(width, 2)
    return x[0].long(), x[1].long(), cu, bounds, runs


def supports(poolings: tuple[Pooling, ...]) -> bool:
    """Whether :class:`GraphForward` computes every one of ``poolings``."""
    return all(type(p) in GRAPHED_POOLINGS for p in poolings)


def pool_packed(
    pooling: Pooling,
    states: Mapping[int, torch.Tensor],
    cu: torch.Tensor,
    ids: torch.Tensor,
    tables: Mapping[str, torch.Tensor],
    pooler: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """``pooling`` (one of :data:`GRAPHED_POOLINGS`) on packed states ``{index: [T, D]}``: float32 [R, D], as its
    :meth:`~bertflow.encoding.pooling.Pooling.pool` on the padded states. ``tables``: the plan's token weights by
    weighting spec; ``pooler``: the model's pooler head ([R, 1, D] -> [R, D])."""
    if isinstance(pooling, LayerMeanPooling):
        indices = pooling.indices
        x = states[indices[0]]
        if len(indices) > 1:  # the layers' float32 average, as the padded pooling takes it
            x = sum((states[i].float() for i in indices[1:]), x.float()) / len(indices)
        weights = tables[pooling.weighting.spec][ids] if pooling.weighting.weighted else None
        return segment_mean(x, cu, weights)
    first = states[max(states)][cu[:-1].long()]  # each sentence's first token: the last layer's [CLS]
    if isinstance(pooling, ClsPooling):
        return first.float()
    if pooler is None:
        raise ValueError("the pooler pooling needs the model's pooler head")
    return pooler(first[:, None]).float()


class GraphForward:
    """The packed forward of ``packed`` (its kernels as set) with each plan's poolings, replayed from a CUDA graph
    per :func:`layout` shape on ``device``."""

    def __init__(self, packed: PackedBert, device: torch.device, max_graphs: int = MAX_GRAPHS) -> None:
        self.packed, self.device, self.max_graphs = packed, device, max_graphs
        self._functions: OrderedDict[tuple[Any, ...], GraphedFunction] = OrderedDict()

    def __call__(
        self, x: torch.Tensor, poolings: tuple[Pooling, ...], layers: tuple[int, ...], tables: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Pooled float32 vectors [T // 2, P x D] (the first rows are the batch's sentences) of the layout ``x``
        (int32 [4, T] on the device) for ``poolings`` (:func:`supports`), which read the hidden-state indices
        ``layers``, with the token weights ``tables``."""
        key = (poolings, layers, tuple((spec, id(t)) for spec, t in sorted(tables.items())))
        fn = self._functions.get(key)
        if fn is None:
            if len(self._functions) >= MAX_PLANS:
                self._functions.popitem(last=False)[1].close()  # not while its last replay may still run
            fn = GraphedFunction(
                self._forward(poolings, layers, tables),
                self.device,
                max_graphs=self.max_graphs,
                capture_at=1,
                warm_up=False,
                input_dtype=None,
                name="packed forward",
            )
            self._functions[key] = fn
            # Every bucket up to the default batch now, on empty layouts: a process's later batches, of any text,
            # replay (a capture costs about one eager batch; first passes over new text paid theirs, as measured in
            # docs/performance.md).
            for size in buckets_up_to(max(DEFAULT_GRAPH_TOKENS, x.shape[1]))[-self.max_graphs :]:
                fn.capture(torch.zeros((4, size), dtype=torch.int32, device=x.device))
        self._functions.move_to_end(key)
        return fn(x)

    def _forward(
        self, poolings: tuple[Pooling, ...], layers: tuple[int, ...], tables: dict[str, torch.Tensor]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        packed = self.packed
        pooler = getattr(packed.model, "pooler", None)

        def forward(x: torch.Tensor) -> torch.Tensor:
            ids, positions, cu, bounds, runs = unpack_layout(x)
            states = packed.encode(
                packed.embed(ids, positions),
                layers,
                lambda q, k, v: grouped_attention(q, k, v, positions, runs, bounds),
            )
            pooled = [pool_packed(p, states, cu, ids, tables, pooler) for p in poolings]
            return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)

        return forward
