"""The chunk pipeline that streams a corpus through the model (what :meth:`SentenceEncoder.iter_encode` runs):
chunks tokenised (:mod:`.tokenization`) and batched (:mod:`.batching`) on background threads while the model
(:mod:`.forward`) runs on the previous one; docs/performance.md gives the steps and what each buys. Results do not
depend on the batch size, the token budget, the chunk size or the number of tokenisation workers (up to
floating-point summation order).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..errors import InputError
from ..resources import return_free_memory
from ..typing import DeviceTransform
from .batching import EncodeStats, Prefetcher, PreparedChunk, cut_chunks, cut_tokens
from .forward import ModelRunner, Pending, PoolingPlan
from .prefault import PageWriter
from .settings import DEFAULT_CHUNK, EncodeSettings, device_kind
from .tokenization import TokenArrays
from .tokenizer_pool import TokenizerPool

#: ``prepare((first_row, sentences or tokens), max_tokens, max_rows, pooled)``: :meth:`SentenceEncoder.prepare_chunk`.
Prepare = Callable[[tuple[int, Sequence[str] | TokenArrays], int, int | None, bool], PreparedChunk]
#: ``into(first_row, rows, width)``: the writable float32 [rows, width] array a chunk's vectors are copied into.
Into = Callable[[int, int, int], np.ndarray]


def chunk_sizes(settings: EncodeSettings, device_type: str, chunk_size: int | None) -> Iterator[int]:
    """Sentences per chunk, chunk after chunk: ``chunk_size``, else ``settings.chunk_size``, else the device's
    default (16,384 on CPU; on CUDA ``settings.first_chunk`` doubling up to 16,384)."""
    chunk_size = chunk_size if chunk_size is not None else settings.chunk_size
    if chunk_size is not None:
        return itertools.repeat(int(chunk_size))
    top = DEFAULT_CHUNK[device_kind(device_type)]
    if device_type != "cuda":
        return itertools.repeat(top)
    first = settings.first_chunk
    ramp = itertools.takewhile(lambda s: s < top, (first << i for i in itertools.count()))
    return itertools.chain(ramp, itertools.repeat(top))


def stream_chunks(
    sentences: Iterable[str] | TokenArrays,
    *,
    runner: ModelRunner,
    plan: PoolingPlan,
    settings: EncodeSettings,
    device: torch.device,
    prepare: Prepare,
    start_pool: Callable[[], TokenizerPool | None],
    stats: EncodeStats,
    batch_size: int | None,
    chunk_size: int | None,
    max_tokens: int | None,
    transform: DeviceTransform | None = None,
    progress: Callable[[int], None] | None = None,
    into: Into | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(first_row, float32 [n, D])`` per chunk of ``sentences``, in order, from ``runner``'s forward passes
    of ``plan``, each written into ``into(first_row, n, D)`` if given (else a new array, on CPU possibly a view of
    the computed tensor); ``stats`` counts each chunk launched. ``start_pool()`` starts the
    tokenisation worker processes for a stream of more than one chunk and returns them (``None``: none run).
    ``progress(rows)`` is told per forward batch off CUDA (a CPU chunk takes minutes), per collected chunk on CUDA
    (per-batch updates there would need a sync). The other arguments are :meth:`SentenceEncoder.iter_encode`'s."""
    if (batch_size is not None and batch_size < 1) or (chunk_size is not None and chunk_size < 1):
        raise InputError("batch_size and chunk_size must be positive")
    if transform is not None and len(plan.poolings) > 1:
        raise InputError("a transform (calibrator) applies to one pooling; ask for one pooling with it")
    budget = max_tokens or settings.token_budget(device.type, runner.dim, runner.graphs_on(settings))
    if budget < 1:
        raise InputError(f"max_tokens must be positive, got {budget}")
    prepared, prefetcher = _prepared_chunks(
        sentences, settings, device, prepare, start_pool, budget, batch_size, chunk_size
    )
    # On CUDA, a chunk is handed out only after the next one is queued on the device, so the GPU keeps
    # working while the caller consumes the result (writes it to a file, runs a calibrator ...).
    delay = device.type == "cuda"
    on_batch = None if delay else progress
    on_chunk = progress if delay else None
    cpu = device.type == "cpu"
    # Without a caller's array to write into, each chunk gets a fresh one; where the pre-fault is on (CUDA by
    # default), a thread writes its pages while the chunk computes, so its copy from the device does not fault
    # them in on this thread (prefault.py says why).
    fresh = into is None and delay and settings.prefaults(device.type)
    pending: Pending | None = None
    pages: PageWriter | None = None  # the pending chunk's fresh array, being written
    error: BaseException | None = None
    try:
        while True:
            try:
                chunk = next(prepared)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - raised below, after the chunks before it
                error = e
                break
            launched = runner.launch(chunk, plan, transform, on_batch, settings.cudnn_attention, settings.unpadded)
            stats.add(chunk)
            if pending is not None:
                yield _collect(runner, pending, cpu, on_chunk, into, pages)
            pending, pages = launched, PageWriter(np.empty(launched.result.shape, np.float32)) if fresh else None
            if not delay:
                yield _collect(runner, pending, cpu, on_chunk, into)
                pending = None
        if pending is not None:
            yield _collect(runner, pending, cpu, on_chunk, into, pages)
    finally:
        if pages is not None:  # no thread outlives the stream, however it ends
            pages.close()
        if prefetcher is not None:
            prefetcher.close()
    if error is not None:
        raise error


def _prepared_chunks(
    sentences: Iterable[str] | TokenArrays,
    settings: EncodeSettings,
    device: torch.device,
    prepare: Prepare,
    start_pool: Callable[[], TokenizerPool | None],
    budget: int,
    batch_size: int | None,
    chunk_size: int | None,
) -> tuple[Iterator[PreparedChunk], Prefetcher | None]:
    """The stream's chunks, tokenised and batched in order: on ``settings.tokenize_workers`` background threads (the
    returned :class:`Prefetcher`, which the caller closes) unless the input is one chunk in all."""
    sizes = chunk_sizes(settings, device.type, chunk_size)
    chunks = cut_tokens(sentences, sizes) if isinstance(sentences, TokenArrays) else cut_chunks(sentences, sizes)

    # One chunk in all (a query, a small batch): nothing to overlap, so no threads, and tokenised here, where
    # it costs less than the round trip to a worker process.
    sized = isinstance(sentences, (Sequence, TokenArrays))
    single = sized and len(sentences) <= next(chunk_sizes(settings, device.type, chunk_size))

    def prepare_one(item: tuple[int, Sequence[str] | TokenArrays]) -> PreparedChunk:
        return prepare(item, budget, batch_size, not single)

    # Before our threads start: the workers are forked from this thread.
    pool = None if single else start_pool()
    threads = settings.tokenize_workers
    if threads is None:
        threads = 2 if pool is not None else 1
    if threads > 0 and not single:
        cuda = device.type == "cuda"
        prefetcher = Prefetcher(chunks, prepare_one, threads, depth=threads + 1, fast_switch=cuda)
        return iter(prefetcher), prefetcher
    return map(prepare_one, chunks), None


def _collect(
    runner: ModelRunner,
    pending: Pending,
    cpu: bool,
    on_chunk: Callable[[int], None] | None,
    into: Into | None,
    pages: PageWriter | None = None,
) -> tuple[int, np.ndarray]:
    """``pending``'s vectors, copied into ``into``'s rows, else into ``pages``' array once written, else a new one."""
    if pages is not None:
        pages.wait(len(pages.array))
        pages.close()
        out = pages.array
    else:
        out = None if into is None else into(pending.offset, *pending.result.shape)
    part = runner.finish(pending, out)
    if cpu:
        # The chunk's activations, MBs of another size per batch shape, are freed now; glibc would keep them
        # in a growing heap and a long stream's resident memory would climb chunk by chunk.
        return_free_memory()
    if on_chunk is not None:
        on_chunk(len(part))
    return pending.offset, part


def split_poolings(part: np.ndarray, plan: PoolingPlan, dim: int) -> dict[str, np.ndarray]:
    """``{pooling key: [n, dim]}`` from the poolings side by side ([n, P x dim], in the plan's order): contiguous
    copies of the column blocks, or ``part`` itself for a single pooling (every caller owns ``part``: a chunk is
    copied off the device into an array of its own)."""
    if len(plan.poolings) == 1:  # possibly transformed, to another width
        return {plan.poolings[0].key: np.asarray(part, dtype=np.float32)}
    return {p.key: np.ascontiguousarray(part[..., i * dim : (i + 1) * dim]) for i, p in enumerate(plan.poolings)}
