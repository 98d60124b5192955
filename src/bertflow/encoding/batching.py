"""Cutting a stream of sentences into chunks and forward batches (pure numpy and host buffers, no model).

A chunk is tokenised, sorted by token count (longest first, stable), cut into token-budget batches by
:func:`plan_batches` and packed into (pinned, on CUDA) int32 host buffers, on a background thread
(:class:`Prefetcher`) while the model runs on the previous chunk.
"""

from __future__ import annotations

import functools
import itertools
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..resources import CountedSetting
from ..validation import check_sentences
from .settings import MIN_LENGTH_RATIO, UNIFORM_FILL
from .tokenization import TokenArrays


def _check_budget(max_tokens: int, max_rows: int | None) -> None:
    """The limits of a batch plan (:func:`plan_batches`, :func:`plan_packed_batches`): positive, ``max_rows`` unset
    or positive."""
    if max_tokens < 1 or (max_rows is not None and max_rows < 1):
        raise InputError("max_tokens and batch_size must be positive")


def plan_batches(
    lengths: np.ndarray,
    max_tokens: int,
    max_rows: int | None = None,
    uniform_fill: float = UNIFORM_FILL,
    min_length_ratio: float = MIN_LENGTH_RATIO,
    min_tokens: int = 0,
) -> list[tuple[int, int]]:
    """``(start, stop)`` ranges covering ``lengths`` ([N] token counts, decreasing) in order: token-budget batches.

    A batch is padded to its first (longest) sentence, so ``rows x width <= max_tokens`` (a sentence longer than
    the budget gets a batch of its own; ``max_rows`` optionally caps rows), and it takes only sentences of at least
    ``min_length_ratio x width`` tokens (0: no limit), which bounds its padding, unless it would then hold fewer
    than ``min_tokens`` padded tokens (not worth a GPU forward's fixed host cost). Where the run of sentences as
    long as the first fills ``uniform_fill`` of the batch's capacity, the batch ends with that run: one length, no
    padding, no attention mask (0 makes every batch uniform, above 1 gives plain greedy budget batches).
    """
    n = len(lengths)
    _check_budget(max_tokens, max_rows)
    # Ascending copy for searchsorted: the run of lengths equal to L ends at the first index with length < L.
    ascending = -np.asarray(lengths, dtype=np.int64)
    batches: list[tuple[int, int]] = []
    start = 0
    while start < n:
        width = int(lengths[start])
        cap = max(1, max_tokens // max(width, 1))
        if max_rows is not None:
            cap = min(cap, max_rows)
        stop = min(n, start + cap)
        if lengths[stop - 1] < min_length_ratio * width:  # too much padding: stop before the short ones,
            short = int(np.searchsorted(ascending, -min_length_ratio * width, side="right"))
            # unless that leaves a batch too small to be worth its fixed cost: then fill it up to min_tokens.
            stop = max(short, min(stop, start + -(-min_tokens // max(width, 1))))
        if lengths[stop - 1] != width:  # the batch would mix lengths
            run_end = int(np.searchsorted(ascending, -width, side="right"))
            if run_end - start >= uniform_fill * cap:
                stop = run_end
        batches.append((start, stop))
        start = stop
    return batches


def plan_packed_batches(lengths: np.ndarray, max_tokens: int, max_rows: int | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` ranges covering ``lengths`` ([N] token counts) in order, each of at most ``max_tokens`` real
    tokens (a longer sentence gets a batch of its own) and ``max_rows`` rows: the batches of a forward whose padding
    costs nothing (the graphed packed forward), cut so that full batches meet one token bucket again and again."""
    _check_budget(max_tokens, max_rows)
    ends = np.cumsum(lengths, dtype=np.int64)
    batches: list[tuple[int, int]] = []
    start = 0
    while start < len(lengths):
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + max_tokens, side="right")))
        if max_rows is not None:
            stop = min(stop, start + max_rows)
        batches.append((start, stop))
        start = stop
    return batches


@dataclass
class HostBatch:
    """One forward pass, ready to copy: ``buffer`` holds [rows x width] token ids then [rows] lengths (int32)."""

    start: int  # first position in the chunk's sorted order
    rows: int
    width: int
    uniform: bool  # every sentence has ``width`` tokens: no padding, no mask
    buffer: torch.Tensor | None  # pinned on CUDA; None: made by :meth:`padded` when asked
    #: The same sentences laid out for a CUDA graph of the packed forward (:func:`bertflow.encoding.graphs.layout`)
    graph_input: torch.Tensor | None = None
    #: Makes :attr:`buffer` where a batch with a graph layout leaves it out (most such batches never need it).
    make_buffer: Callable[[], torch.Tensor] | None = field(default=None, repr=False)

    def padded(self) -> torch.Tensor:
        """:attr:`buffer`, made now if it was left out."""
        if self.buffer is None:
            assert self.make_buffer is not None
            self.buffer, self.make_buffer = self.make_buffer(), None
        return self.buffer


@dataclass
class PreparedChunk:
    """A tokenised, sorted and batched chunk. ``inverse[i]`` is the sorted position of input row ``i``."""

    offset: int  # stream row of the chunk's first sentence
    n: int
    inverse: torch.Tensor  # int64 [n]
    batches: list[HostBatch]
    real_tokens: int
    padded_tokens: int


@dataclass
class EncodeStats:
    """What the last ``encode``/``iter_encode`` call did (for benchmarks; filled as chunks complete): sentences,
    their real tokens (after truncation), padded tokens processed (rows x width), forward batches, and those of
    one length only (no mask)."""

    sentences: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    uniform_batches: int = 0
    chunk_sizes: list[int] = field(default_factory=list)

    def add(self, chunk: PreparedChunk) -> None:
        """Count ``chunk`` (launched on the device) into these totals."""
        self.sentences += chunk.n
        self.real_tokens += chunk.real_tokens
        self.padded_tokens += chunk.padded_tokens
        self.batches += len(chunk.batches)
        self.uniform_batches += sum(b.uniform for b in chunk.batches)
        self.chunk_sizes.append(chunk.n)

    @property
    def padding_efficiency(self) -> float:
        """real / padded tokens (1.0: no compute spent on padding)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


_END = object()

#: Python's thread switch interval (seconds) while a :class:`Prefetcher` feeds a CUDA encode (``fast_switch``).
#: The thread that launches the kernels holds the GIL almost all the time; each time a preparing thread takes it,
#: the launching thread waited up to Python's default 5 ms to get it back, with the GPU idle when it is ahead
#: (MiniLM-L6 on an H200: docs/performance.md). ``None`` leaves the interval alone.
FAST_SWITCH_INTERVAL: float | None = 0.0005
#: Python's thread switch interval, lowered while any fast-switching :class:`Prefetcher` runs.
SWITCH_INTERVAL = CountedSetting(sys.getswitchinterval, sys.setswitchinterval)


class Prefetcher:
    """Runs ``prepare`` on the items of an iterator on background threads; hands results back in order.

    A feeder thread pulls items (so a slow reader, such as a file, is off the main thread too) and submits
    them to ``workers`` threads; at most ``depth`` results wait, which bounds memory. Exceptions reach the
    consumer at the position where they happened, after every earlier result. ``fast_switch``: until
    :meth:`close`, Python switches threads every :data:`FAST_SWITCH_INTERVAL` seconds (for a consumer that
    launches GPU work and must not wait for the GIL).
    """

    def __init__(
        self, items: Iterator[Any], prepare: Callable[[Any], Any], workers: int, depth: int, fast_switch: bool = False
    ) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bertflow-tokenize")
        self._thread = threading.Thread(target=self._feed, args=(items, prepare), name="bertflow-feed", daemon=True)
        self._thread.start()
        self._switch = fast_switch and FAST_SWITCH_INTERVAL is not None
        if self._switch:
            SWITCH_INTERVAL.hold(min(FAST_SWITCH_INTERVAL, sys.getswitchinterval()))  # type: ignore[type-var]

    def _put(self, obj: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(obj, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _feed(self, items: Iterator[Any], prepare: Callable[[Any], Any]) -> None:
        try:
            for item in items:
                if not self._put(self._pool.submit(prepare, item)):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            failed: Future[Any] = Future()
            failed.set_exception(e)
            self._put(failed)
            self._put(_END)

    def __iter__(self) -> Iterator[Any]:
        while True:
            obj = self._queue.get()
            if obj is _END:
                return
            yield obj.result()

    def close(self) -> None:
        """Stop feeding and drop queued work (the consumer stopped early, or everything was consumed)."""
        self._stop.set()
        # Wait for the feeder and the task in flight: a thread still inside the Rust tokenizer when the
        # interpreter exits aborts the process ("terminate called without an active exception").
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._switch:
            self._switch = False
            SWITCH_INTERVAL.release()


def cut_chunks(sentences: Iterable[str], sizes: Iterator[int]) -> Iterator[tuple[int, list[str]]]:
    """Cut a stream into ``(first_row, sentences)`` chunks of the given sizes, checking each sentence."""
    it = iter(sentences)
    offset = 0
    for size in sizes:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        check_sentences(chunk, offset=offset)
        yield offset, chunk
        offset += len(chunk)


def cut_tokens(tokens: TokenArrays, sizes: Iterator[int]) -> Iterator[tuple[int, TokenArrays]]:
    """Cut already tokenised sentences into ``(first_row, tokens)`` chunks of the given sizes."""
    offset = 0
    for size in sizes:
        if offset >= len(tokens):
            return
        stop = min(len(tokens), offset + size)
        yield offset, tokens.slice(offset, stop)
        offset = stop


def pack_rows(
    tokens: TokenArrays, rows: np.ndarray, width: int, pad_id: int, uniform: bool, pinned: bool
) -> torch.Tensor:
    """Lay out ``rows`` of a chunk as an int32 buffer: [len(rows) x width] padded ids, then [len(rows)] lengths."""
    n = len(rows)
    buffer = torch.empty(n * width + n, dtype=torch.int32, pin_memory=pinned)
    flat = buffer.numpy()
    ids = flat[: n * width].reshape(n, width)
    starts = tokens.offsets[rows]
    lengths = tokens.offsets[rows + 1] - starts
    gather = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
    if uniform:
        np.take(tokens.ids, gather, out=ids)
    else:
        valid = np.arange(width)[None, :] < lengths[:, None]
        np.take(tokens.ids, np.where(valid, gather, 0), out=ids)
        ids[~valid] = pad_id
    flat[n * width :] = lengths
    return buffer


def prepare_chunk(
    offset: int,
    tokens: TokenArrays,
    *,
    max_tokens: int,
    max_rows: int | None,
    uniform_fill: float,
    min_length_ratio: float,
    min_tokens: int,
    pad_id: int,
    pinned: bool,
    layout: Callable[[TokenArrays, np.ndarray], torch.Tensor | None] | None = None,
) -> PreparedChunk:
    """Sort one tokenised chunk (its first sentence at stream row ``offset``) by length, longest first, stable,
    and pack its forward batches (:func:`plan_batches`' options) into host buffers, ``pinned`` for CUDA;
    ``layout(tokens, rows)`` also lays each batch out for a CUDA graph (:attr:`HostBatch.graph_input`), and then
    ``max_tokens`` counts real tokens (:func:`plan_packed_batches`)."""
    lengths = tokens.lengths
    # Stable sort, longest first: equal lengths keep input order, so results never depend on ties.
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    batches = []
    padded = 0
    if layout is not None:  # the graphed forward: a batch's padding costs nothing, its real tokens are counted
        planned = plan_packed_batches(sorted_lengths, max_tokens, max_rows)
    else:
        planned = plan_batches(sorted_lengths, max_tokens, max_rows, uniform_fill, min_length_ratio, min_tokens)
    for start, stop in planned:
        rows_idx = order[start:stop]
        width = int(sorted_lengths[start])
        uniform = bool(sorted_lengths[stop - 1] == width)
        graph_input = layout(tokens, rows_idx) if layout is not None else None
        if graph_input is None:
            batch = HostBatch(
                start, stop - start, width, uniform, pack_rows(tokens, rows_idx, width, pad_id, uniform, pinned)
            )
        else:  # the padded buffer only if the graph is not used after all (the tokens stay referenced until then)
            make = functools.partial(pack_rows, tokens, rows_idx, width, pad_id, uniform, pinned)
            batch = HostBatch(start, stop - start, width, uniform, None, graph_input, make)
        batches.append(batch)
        padded += (stop - start) * width
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order), dtype=np.int64)
    inv = torch.from_numpy(inverse)
    if pinned:
        inv = inv.pin_memory()
    return PreparedChunk(offset, len(order), inv, batches, int(tokens.offsets[-1]), padded)
