"""Embedding cache: each distinct sentence is encoded once per (encoder, pooling, max_length, dtype) and kept on disk;
:func:`embed_cached` encodes what the cache lacks in one pass for every requested pooling.

Layout of the cache::

    ROOT/                                    ~/.cache/bertflow/embeddings, $BERTFLOW_CACHE_DIR or --cache-dir
      <model-slug>--<fingerprint>--<tokenizer fingerprint>/
        <pooling>--len<max_length>--<dtype>/
          meta.json                          what the folder holds (model id, fingerprint, pooling, dim ...)
          <shard>.npy                        float32 [n, D] embeddings
          <shard>.keys.json                  the sha1 (hex, of the UTF-8 sentence) of each row, in row order

Shards are immutable and written atomically, the ``.keys.json`` last (a shard without it is ignored), so two
processes writing one folder never corrupt it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..encoding.encoder import SentenceEncoder
from ..encoding.pooling import Pooling
from ..errors import InputError
from ..io.files import atomic_file, atomic_write_text
from ..validation import validate_sentences

logger = logging.getLogger(__name__)

#: Environment variable naming the embedding cache folder.
CACHE_DIR_ENV = "BERTFLOW_CACHE_DIR"

_FORMAT = 1


def default_cache_dir() -> Path:
    """``$BERTFLOW_CACHE_DIR`` if set, else ``~/.cache/bertflow/embeddings``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path("~/.cache/bertflow/embeddings").expanduser()


def sentence_key(sentence: str) -> str:
    """The cache key of a sentence: sha1 (hex) of its exact UTF-8 bytes (no stripping, case kept)."""
    return hashlib.sha1(sentence.encode("utf-8")).hexdigest()


def pooling_key(pooling: str | Sequence[int] | Pooling, num_layers: int) -> str:
    """Canonical text of a pooling for file names and dictionary keys, resolved against the model: ``"first-last"``
    and ``"first_last_avg"`` share a key, ``[1, 6]`` on a 6-layer model is ``"layers-1-6"``."""
    return Pooling.parse(pooling, num_layers).key


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-80:] or "model"


class EmbeddingCache:
    """On-disk store of sentence embeddings keyed by sentence sha1, one folder per encoder setting, under ``root``
    (``None``: :func:`default_cache_dir`). ``embed_cached(encoder, sentences, ["mean", "cls"], cache=cache)``
    encodes once, and reads from disk the next time."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()

    def folder(self, encoder: SentenceEncoder, pooling: str | Sequence[int] | Pooling) -> Path:
        """The folder holding ``encoder``'s embeddings under ``pooling`` (not created)."""
        dtype = str(encoder.dtype).removeprefix("torch.")
        # Both fingerprints: new weights or an edited tokenizer pipeline change the vectors, so either misses.
        slug = _slug(Path(encoder.model_id).name or encoder.model_id)
        model = f"{slug}--{encoder.fingerprint()}--{encoder.tokenizer_fingerprint()}"
        return self.root / model / f"{_stored_key(encoder, pooling)}--len{encoder.max_length}--{dtype}"

    def lookup(
        self, encoder: SentenceEncoder, pooling: str | Sequence[int] | Pooling, sentences: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Cached embeddings of ``sentences``: ``(embeddings, found)``, float32 [N, D] (rows of sentences not in the
        cache are zero) and a boolean mask [N] of the sentences that were found."""
        out = np.zeros((len(sentences), encoder.dim), dtype=np.float32)
        found = np.zeros(len(sentences), dtype=bool)
        folder = self.folder(encoder, pooling)
        if not folder.is_dir() or not sentences:
            return out, found
        wanted: dict[str, list[int]] = {}
        for i, s in enumerate(sentences):
            wanted.setdefault(sentence_key(s), []).append(i)
        for keys_file in sorted(folder.glob("*.keys.json")):
            shard = keys_file.with_name(keys_file.name[: -len(".keys.json")] + ".npy")
            try:
                keys = json.loads(keys_file.read_text(encoding="utf-8"))
                rows = np.load(shard, mmap_mode="r")
            except (OSError, ValueError) as e:
                logger.warning("embedding cache: ignoring unreadable shard %s (%s)", shard, e)
                continue
            if rows.shape != (len(keys), encoder.dim):
                logger.warning("embedding cache: ignoring shard %s with shape %s", shard, rows.shape)
                continue
            hits = [(r, wanted[k]) for r, k in enumerate(keys) if k in wanted]
            src = np.fromiter((r for r, _ in hits), dtype=np.int64, count=len(hits))
            block = np.asarray(rows[src], dtype=np.float32)
            for (_, targets), row in zip(hits, block, strict=True):
                out[targets] = row
                found[targets] = True
        return out, found

    def store(
        self,
        encoder: SentenceEncoder,
        pooling: str | Sequence[int] | Pooling,
        sentences: Sequence[str],
        embeddings: np.ndarray,
    ) -> Path:
        """Write one shard of ``embeddings`` [N, D] for ``sentences`` (N of them) and return its path."""
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if emb.shape != (len(sentences), encoder.dim):
            raise InputError(f"embeddings have shape {emb.shape}, expected ({len(sentences)}, {encoder.dim})")
        folder = self.folder(encoder, pooling)
        folder.mkdir(parents=True, exist_ok=True)
        meta_file = folder / "meta.json"
        if not meta_file.exists():
            meta = {
                "format": _FORMAT,
                "model": encoder.model_id,
                "fingerprint": encoder.fingerprint(),
                "tokenizer_fingerprint": encoder.tokenizer_fingerprint(),
                "pooling": _stored_key(encoder, pooling),
                "max_length": encoder.max_length,
                "dtype": str(encoder.dtype).removeprefix("torch."),
                "dim": encoder.dim,
            }
            atomic_write_text(meta_file, json.dumps(meta, indent=2) + "\n")
        # Unique, sortable shard name: concurrent writers never collide.
        name = f"{time.time_ns():020d}-{os.getpid()}"
        shard = folder / f"{name}.npy"
        with atomic_file(shard, "wb") as fh:
            np.save(fh, emb)
        # The keys file is written last: it marks the shard complete.
        atomic_write_text(folder / f"{name}.keys.json", json.dumps([sentence_key(s) for s in sentences]))
        return shard


def _stored_key(encoder: SentenceEncoder, pooling: str | Sequence[int] | Pooling) -> str:
    """:func:`pooling_key`, and for a frequency-weighted pooling the digest of the encoder's token statistics too:
    the same pooling weighted by other counts gives other vectors, which must not be served from the cache."""
    parsed = Pooling.parse(pooling, encoder.num_layers)
    stats = encoder.token_statistics
    if not parsed.weighting.weighted or stats is None:  # without statistics the encoder refuses before any write
        return parsed.key
    return f"{parsed.key}--tokens{stats.digest()}"


def embed_cached(
    encoder: SentenceEncoder,
    sentences: Iterable[str],
    poolings: Sequence[str | Sequence[int] | Pooling],
    *,
    cache: EmbeddingCache | None = None,
    batch_size: int | None = None,
    chunk_size: int = 8192,
    show_progress_bar: bool | None = None,
) -> dict[str, np.ndarray]:
    """Embeddings of N ``sentences`` (duplicates allowed) under each pooling, ``{pooling_key: float32 [N, D]}``,
    encoding only what ``cache`` lacks (``None``: everything, nothing stored), in one pass.

    Sentences missing under *any* requested pooling are encoded once with every pooling that lacks them, in
    chunks of ``chunk_size`` that are written to the cache as they finish (an interrupted run resumes where it
    stopped). ``batch_size`` caps sentences per forward pass (default: the encoder's token budget);
    ``show_progress_bar=None`` shows a bar for 4,096 sentences or more to encode.
    """
    from tqdm.auto import tqdm

    items = validate_sentences(sentences)
    parsed = {p.key: p for p in (Pooling.parse(p, encoder.num_layers) for p in poolings)}
    distinct = list(dict.fromkeys(items))
    result: dict[str, np.ndarray] = {}
    missing: dict[str, np.ndarray] = {}  # per pooling key: the rows of distinct the cache lacks
    for key, pooling in parsed.items():
        if cache is None:
            result[key], found = np.zeros((len(distinct), encoder.dim), dtype=np.float32), np.zeros(len(distinct), bool)
        else:
            result[key], found = cache.lookup(encoder, pooling, distinct)
        missing[key] = ~found
    todo = np.flatnonzero(np.logical_or.reduce(list(missing.values())))
    if len(todo):
        logger.info("encoding %d of %d distinct sentences (%s) with %s", len(todo), len(distinct), ", ".join(parsed),
                    encoder.model_id)  # fmt: skip
        need = [k for k in missing if missing[k].any()]  # the poolings that lack at least one sentence
        show = len(todo) >= 4096 if show_progress_bar is None else show_progress_bar
        with tqdm(total=len(todo), desc="encode", unit="sent", disable=not show) as bar:
            # One stream through the encoder; each chunk is stored as it arrives, so an interrupted run resumes.
            stream = encoder.iter_encode(
                [distinct[i] for i in todo],
                poolings=[parsed[k] for k in need],
                batch_size=batch_size,
                chunk_size=chunk_size,
                progress=bar.update,
            )
            start = 0
            for encoded in stream:
                chunk = todo[start : start + len(encoded[need[0]])]
                start += len(chunk)
                for key in need:
                    # Only rows that were missing are filled and stored: cached rows stay exactly as they were.
                    sel = missing[key][chunk]
                    result[key][chunk[sel]] = encoded[key][sel]
                    if cache is not None and sel.any():
                        cache.store(encoder, parsed[key], [distinct[i] for i in chunk[sel]], encoded[key][sel])
    position = {s: i for i, s in enumerate(distinct)}
    rows = np.fromiter((position[s] for s in items), dtype=np.int64, count=len(items))
    return {key: result[key][rows] for key in parsed}
