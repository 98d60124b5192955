"""Helpers shared by the CLI commands: building encoders, reading corpora, quieting libraries."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

__all__ = ["EncodingErrors", "build_encoder", "load_embedder", "read_corpus", "quiet_libraries"]


class EncodingErrors(str, enum.Enum):
    """What to do with bytes that are not UTF-8."""

    strict = "strict"
    replace = "replace"


def quiet_libraries() -> None:
    """Silence transformers' per-load progress bars and info logs; bertflow shows its own progress."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_encoder(model: str | None, pooling: str, max_length: int, device: str | None, dtype: str):
    """A :class:`~bertflow.encoder.SentenceEncoder` from CLI options."""
    from ..encoder import SentenceEncoder

    return SentenceEncoder(model, pooling=pooling, max_length=max_length, device=device, dtype=dtype)


def load_embedder(model_dir: str, device: str | None, dtype: str):
    """Load a fitted :class:`~bertflow.pipeline.Embedder` folder (or hub id)."""
    from ..pipeline import Embedder

    return Embedder.load(model_dir, device=device, dtype=dtype)


def read_corpus(path: Path, columns: Sequence[str] | None, errors: str, unique: bool) -> list[str]:
    """Sentences from a text file (one per line) or from one or more columns of a TSV with a header."""
    from ..data import read_sentences, read_tsv_column

    if not columns:
        return read_sentences(path, errors=errors, unique=unique)
    sentences: list[str] = []
    for col in columns:
        key: str | int = int(col) if col.isdigit() else col
        sentences.extend(read_tsv_column(path, key, errors=errors))
    if unique:
        sentences = list(dict.fromkeys(sentences))
    return sentences
