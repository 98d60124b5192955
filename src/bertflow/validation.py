"""Input checks shared by the encoder, the calibrators and the CLI.

Each check raises :class:`~bertflow.errors.InputError` with a message that names the offending item, so bad input
fails at the boundary instead of as a traceback from deep inside torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import InputError

__all__ = [
    "check_array",
    "check_epochs",
    "check_finite",
    "check_sentence",
    "check_sentences",
    "sentence_list",
    "validate_sentences",
]


def check_sentence(index: int, item: object, *, what: str = "sentence") -> str:
    """Return ``item`` if it is a non-blank string, else raise naming ``index`` and the problem."""
    if not isinstance(item, str):
        raise InputError(f"{what} {index} is {type(item).__name__} ({item!r:.40}), not a string")
    if not item.strip():
        raise InputError(f"{what} {index} is empty or whitespace only; remove blank sentences first")
    return item


def sentence_list(sentences: Iterable[object], *, what: str = "sentence") -> list[Any]:
    """``sentences`` as a list, refusing a single string (a common slip) but not yet checking the items."""
    if isinstance(sentences, (str, bytes)):
        raise InputError(f"expected a list of {what}s, got a single {type(sentences).__name__}")
    return list(sentences)


def check_sentences(items: list[Any], *, offset: int = 0, what: str = "sentence") -> None:
    """Raise (via :func:`check_sentence`, naming ``offset + index``) at the first item that is not a non-blank
    string. About 0.1 us per sentence: the common case is tested inline and only a suspect goes to the full check."""
    for i, s in enumerate(items):
        if type(s) is not str or not s or s.isspace():  # same verdict as check_sentence's strip()
            check_sentence(offset + i, s, what=what)


def validate_sentences(sentences: Iterable[object], *, what: str = "sentence") -> list[str]:
    """Check that every item is a non-blank string and return them as a list."""
    items = sentence_list(sentences, what=what)
    check_sentences(items, what=what)
    return items


def check_finite(x: np.ndarray, *, what: str) -> None:
    """Raise naming the first bad row and column if ``x`` holds NaN or Inf."""
    # In blocks of rows: a boolean mask of a million embeddings would cost as much memory as a float32 copy.
    step = max(1, (1 << 22) // max(1, x.shape[-1])) if x.ndim == 2 else max(1, len(x))
    for start in range(0, len(x), step):
        finite = np.isfinite(x[start : start + step])
        if finite.all():
            continue
        row, col = (int(v) for v in np.argwhere(~finite)[0]) if x.ndim == 2 else (int(np.argmin(finite)), 0)
        row += start
        raise InputError(
            f"{what} contain NaN or Inf (first at row {row}, column {col}); the model or its input is broken"
        )


def check_array(
    x: Any, *, n_features: int | None = None, what: str = "X", min_rows: int = 1, dtype: type = np.float64
) -> np.ndarray:
    """Validate an embedding matrix: 2-D, numeric, finite, with ``n_features`` columns if given.

    Returns:
        the array as ``dtype`` [N, D] (float64 by default: calibrators compute in float64 and return float32),
        without a copy when it already has that dtype.
    """
    try:
        arr = np.asarray(x, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} is not a numeric array: {e}") from None
    if arr.ndim != 2:
        raise InputError(f"{what} must be 2-D [n_samples, n_features], got shape {arr.shape}")
    if arr.shape[0] < min_rows:
        raise InputError(f"{what} has {arr.shape[0]} rows; at least {min_rows} needed")
    if n_features is not None and arr.shape[1] != n_features:
        raise InputError(f"{what} has {arr.shape[1]} features, but this calibrator was fitted on {n_features}")
    check_finite(arr, what=what)
    return arr


def check_epochs(epochs: float) -> float:
    """``epochs`` as a float, refused unless finite and positive (``inf`` would never end, ``nan`` never start)."""
    try:
        value = float(epochs)
    except (TypeError, ValueError):
        raise InputError(f"epochs must be a positive number, got {epochs!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"epochs must be a positive, finite number (fractions allowed), got {epochs!r}")
    return value
