"""Input checks shared by the encoder, the calibrators and the CLI.

Each check raises :class:`~bertflow.errors.InputError` with a message that names the offending item, so bad input
fails at the boundary instead of as a traceback from deep inside torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import InputError

__all__ = ["check_sentence", "validate_sentences", "check_finite", "check_array"]


def check_sentence(index: int, item: object, *, what: str = "sentence") -> str:
    """Return ``item`` if it is a non-blank string, else raise naming ``index`` and the problem."""
    if not isinstance(item, str):
        raise InputError(f"{what} {index} is {type(item).__name__} ({item!r:.40}), not a string")
    if not item.strip():
        raise InputError(f"{what} {index} is empty or whitespace only; remove blank sentences first")
    return item


def validate_sentences(sentences: Iterable[object], *, what: str = "sentence") -> list[str]:
    """Check that every item is a non-blank string and return them as a list."""
    if isinstance(sentences, (str, bytes)):
        raise InputError(f"expected a list of {what}s, got a single {type(sentences).__name__}")
    return [check_sentence(i, s, what=what) for i, s in enumerate(sentences)]


def check_finite(x: np.ndarray, *, what: str) -> None:
    """Raise naming the first bad row and column if ``x`` holds NaN or Inf."""
    finite = np.isfinite(x)
    if not finite.all():
        row, col = (int(v) for v in np.argwhere(~finite)[0])
        raise InputError(
            f"{what} contain NaN or Inf (first at row {row}, column {col}); the model or its input is broken"
        )


def check_array(x: Any, *, n_features: int | None = None, what: str = "X", min_rows: int = 1) -> np.ndarray:
    """Validate an embedding matrix: 2-D, numeric, finite, with ``n_features`` columns if given.

    Returns:
        the array as float64 [N, D] (calibrators compute in float64 and return float32).
    """
    try:
        arr = np.asarray(x, dtype=np.float64)
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
