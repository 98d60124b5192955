"""Encoding in memory with one spawned process per local device (``["cuda:0", "cuda:1"]``, or ``"cpu"`` repeated).

:func:`encode_multi_device` is what ``Embedder.encode(..., device=[...])`` runs; for files, and for several
machines, ``bertflow distributed-encode`` (:mod:`bertflow.scale.encode`) writes a sharded store instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import CompatibilityError, InputError
from ..resources import share, share_cpu_threads
from ..validation import validate_sentences
from .encoder import SentenceEncoder


def encode_multi_device(
    sentences: Sequence[str],
    encoder: SentenceEncoder | dict[str, Any],
    devices: Sequence[str],
    *,
    dtype: str = "auto",
    batch_size: int | None = None,
    chunk_size: int = 16384,
    threads_per_process: int | None = None,
) -> np.ndarray:
    """float32 [N, D] of ``sentences`` in input order, encoded by one spawned process per entry of ``devices``
    (e.g. ``["cuda:0", "cuda:1"]``; ``"cpu"`` may repeat, splitting the cores), no torchrun.

    Each process loads ``encoder`` (a :class:`SentenceEncoder` that loads by id or path, or its ``get_config()``)
    on its device in ``dtype`` and writes its contiguous, chunk-aligned part into a shared-memory result, equal bit
    for bit to ``iter_encode(sentences, batch_size=..., chunk_size=...)`` on one device of the same kind (on CPU at
    the same thread count: ``threads_per_process``, default the usable cores split between the CPU processes). Pays
    off from a few tens of thousands of sentences; for files and several machines use
    :func:`bertflow.scale.encode.encode_file_to_store`.
    """
    import torch.multiprocessing as mp

    items = validate_sentences(sentences)
    config = encoder.get_config() if hasattr(encoder, "get_config") else dict(encoder)
    # Not in the config (the statistics only by digest), but they shape the batches or weight the tokens.
    overrides = {k: getattr(encoder, k, None) for k in ("max_tokens", "token_statistics")}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not devices:
        raise InputError("encode_multi_device needs at least one device")
    if chunk_size < 1 or (batch_size is not None and batch_size < 1):
        raise InputError("batch_size and chunk_size must be positive")
    n, dim = len(items), int(config["dim"])
    if n == 0:
        return np.empty((0, dim), dtype=np.float32)
    # Whole chunks per device: each process then length-sorts exactly the chunks one process would.
    n_chunks = -(-n // chunk_size)
    bounds = [
        (min(n, a * chunk_size), min(n, b * chunk_size))
        for a, b in (share(n_chunks, i, len(devices)) for i in range(len(devices)))
    ]
    out = torch.empty((n, dim), dtype=torch.float32).share_memory_()
    mp.spawn(
        _encode_part,
        args=(config, overrides, list(devices), dtype, batch_size, chunk_size, threads_per_process, bounds, items, out),
        nprocs=len(devices),
        join=True,
    )
    return out.numpy().copy()


def _encode_part(
    index: int,
    config: dict[str, Any],
    overrides: dict[str, Any],
    devices: list[str],
    dtype: str,
    batch_size: int | None,
    chunk_size: int,
    threads: int | None,
    bounds: list[tuple[int, int]],
    sentences: list[str],
    out: torch.Tensor,
) -> None:
    start, stop = bounds[index]
    if start == stop:
        return
    share_cpu_threads(devices, index, threads)
    encoder = SentenceEncoder.from_config(config, device=devices[index], dtype=dtype, **overrides)
    if encoder.get_config().get("fingerprint") != config.get("fingerprint"):
        raise CompatibilityError(f"{config['model']} on {devices[index]} has other weights than the encoder given")
    row = start
    for part in encoder.iter_encode(sentences[start:stop], chunk_size=chunk_size, batch_size=batch_size):
        out[row : row + len(part)] = torch.from_numpy(part)
        row += len(part)
