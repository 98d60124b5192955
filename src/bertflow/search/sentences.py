"""Sentences in, hits out: an :class:`~bertflow.search.index.EmbeddingIndex` built from sentences or a file, extended
and queried through a fitted :class:`~bertflow.embedder.Embedder`, whose identity the index records and checks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..errors import InputError
from ..io.text import iter_lines, read_tsv_column
from ..validation import is_blank, validate_sentences
from .index import EmbeddingIndex, ItemId, SearchHit

if TYPE_CHECKING:
    from ..embedder import Embedder


logger = logging.getLogger(__name__)


def index_sentences(
    embedder: Embedder,
    sentences: Sequence[str],
    ids: Sequence[ItemId] | None = None,
    *,
    batch_size: int | None = None,
    show_progress_bar: bool | None = None,
    **kwargs: Any,
) -> EmbeddingIndex:
    """A cosine index of ``sentences`` (a list; for a file :func:`index_file`) embedded by ``embedder``, recording
    its :meth:`~bertflow.embedder.Embedder.identity` so that :func:`query` and a saved copy refuse any other model.
    ``ids``: one unique str or int per sentence (default: positions 0..N-1); ``kwargs``: search settings of
    :class:`~bertflow.search.ann.VectorSearch` (``backend``, ``approximate`` ...)."""
    if isinstance(sentences, str):
        raise InputError("index_sentences takes a list of sentences; to index a file use index_file(embedder, path)")
    items = validate_sentences(sentences)
    if not items:
        raise InputError("the corpus is empty: nothing to index")
    index = EmbeddingIndex(embedder.calibrator_dim(), model=embedder.identity(), **kwargs)
    index.model_source = embedder.source
    add_sentences(index, embedder, items, ids, batch_size=batch_size, show_progress_bar=show_progress_bar)
    logger.info("indexed %d sentences (%s backend)", len(index), index.backend)
    return index


def index_file(
    embedder: Embedder,
    path: str | Path,
    *,
    column: str | int | None = None,
    unique: bool = False,
    errors: Literal["strict", "replace"] = "strict",
    **kwargs: Any,
) -> EmbeddingIndex:
    """:func:`index_sentences` of a UTF-8 file: one sentence per line, or one ``column`` of a TSV with a header.
    Ids are 1-based line numbers for a text file and 1-based data-row numbers for a TSV. ``unique`` drops
    repeated sentences (keeping the first)."""
    if column is None:
        rows = [(number, text) for number, text in iter_lines(path, errors=errors) if not is_blank(text)]
    else:
        rows = list(enumerate(read_tsv_column(path, column, errors=errors, refuse_blank=True), start=1))
    if unique:
        first: dict[str, int] = {}
        for number, text in rows:
            first.setdefault(text, number)
        rows = [(number, text) for text, number in first.items()]
    if not rows:
        raise InputError(f"no sentences in {path}")
    return index_sentences(embedder, [t for _, t in rows], [n for n, _ in rows], **kwargs)


def add_sentences(
    index: EmbeddingIndex,
    embedder: Embedder,
    sentences: Sequence[str],
    ids: Sequence[ItemId] | None = None,
    *,
    batch_size: int | None = None,
    show_progress_bar: bool | None = None,
) -> None:
    """Embed ``sentences`` with ``embedder`` (checked against the model of ``index`` first) and append them with
    their texts, streaming chunk by chunk (:meth:`Embedder.iter_encode`)."""
    index.check_model(embedder.identity())
    items = validate_sentences(sentences)
    if ids is not None and len(ids) != len(items):
        raise InputError(f"got {len(ids)} ids for {len(items)} sentences; give one id per sentence")
    start = 0
    for part in embedder.iter_encode(items, batch_size=batch_size, show_progress_bar=show_progress_bar):
        stop = start + len(part)
        index.add(part, None if ids is None else list(ids[start:stop]), items[start:stop])
        start = stop


def query(
    index: EmbeddingIndex,
    embedder: Embedder,
    queries: str | Sequence[str],
    top_k: int = 10,
    *,
    show_progress_bar: bool | None = None,
) -> list[list[SearchHit]]:
    """The ``top_k`` rows of ``index`` closest to each query sentence (one string counts as a list of one), embedded
    by ``embedder`` (cosine in its calibrated space): one list of hits per query, best first. CompatibilityError
    for an index built with another model or from bare vectors (:meth:`EmbeddingIndex.check_model`)."""
    index.check_model(embedder.identity())
    items = [queries] if isinstance(queries, str) else list(queries)
    return index.search(np.atleast_2d(embedder.encode(items, show_progress_bar=show_progress_bar)), top_k=top_k)
