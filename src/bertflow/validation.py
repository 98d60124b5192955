"""Input checks shared by the encoder, the calibrators and the CLI.

Each check raises :class:`~bertflow.errors.InputError` with a message that names the offending item, so bad input
fails at the boundary instead of as a traceback from deep inside torch.
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .errors import InputError, InputTypeError

#: Largest plausible magnitude of a calibrated coordinate, in units of the input's scale (see :func:`output_limit`):
#: standardised coordinates have unit variance (Chebyshev: beyond 1e6 with probability <= 1e-12), the other maps
#: stay within a few times the input, while a corrupted weight (a flipped exponent bit) lands far beyond.
OUTPUT_LIMIT = 1e6


#: Characters that are not whitespace to ``str.isspace`` but show nothing either (zero-width space, non-joiner and
#: joiner, word joiner, U+FEFF, Mongolian vowel separator, NUL): the tokenizer drops them, so a line made of them and
#: whitespace would embed as an empty one.
INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u180e\x00"
_BLANK = re.compile(f"[\\s{INVISIBLE}]*")
#: Every character :data:`_BLANK` matches (``\\s`` is ``str.isspace``; tested over all code points), for ``str.strip``.
_BLANK_CHARS = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_BLANK_CHARS += "\u2028\u2029\u202f\u205f\u3000" + INVISIBLE
_strip_blank = operator.methodcaller("strip", _BLANK_CHARS)
#: A lone surrogate (U+D800-U+DFFF) is no text: it cannot be encoded as UTF-8, so the tokenizer would fail on it.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Sentences :func:`check_sentences` passes in one C loop (about 0.3 ms of STS sentences on a GPU host's core).
CHECK_SLICE = 512
#: Largest magnitude a calibrator takes: the squares of larger values (covariances, norms) overflow float64.
MAX_INPUT_MAGNITUDE = 1e100


def is_blank(text: str) -> bool:
    """Whether ``text`` is empty or made only of whitespace and :data:`INVISIBLE` characters (the one blank rule of
    the readers and the sentence checks). Stops at the first visible character, so it costs next to nothing."""
    return _BLANK.fullmatch(text) is not None


def check_sentence(index: int, item: object, *, what: str = "sentence") -> str:
    """Return ``item`` if it is a non-blank string (:func:`is_blank`), else raise naming ``index`` and the problem."""
    if not isinstance(item, str):
        raise InputError(f"{what} {index} is {type(item).__name__} ({item!r:.40}), not a string")
    if is_blank(item):
        raise InputError(
            f"{what} {index} is empty or only whitespace or invisible characters (zero-width, U+FEFF, NUL); "
            "remove blank sentences first"
        )
    surrogate = _SURROGATE.search(item)
    if surrogate is not None:
        raise InputError(
            f"{what} {index} holds a lone surrogate (U+{ord(surrogate.group()):04X} at character {surrogate.start()}), "
            "which is not text and cannot be encoded as UTF-8; fix where the string came from (e.g. decode its bytes "
            "with errors='replace')"
        )
    return item


def sentence_list(sentences: Iterable[object], *, what: str = "sentence") -> list[Any]:
    """``sentences`` as a list, refusing a single string (a common slip) but not yet checking the items."""
    if isinstance(sentences, (str, bytes)):
        raise InputError(f"expected a list of {what}s, got a single {type(sentences).__name__}")
    return list(sentences)


def check_sentences(items: list[Any], *, offset: int = 0, what: str = "sentence") -> None:
    """Raise (via :func:`check_sentence`, naming ``offset + index``) at the first item that is not a non-blank
    string. Strings are passed in C loops (one join, one UTF-8 encoding, which fails at a lone surrogate, and one
    strip per item: 3x faster than a Python loop) over slices of :data:`CHECK_SLICE` items; a slice that fails them
    is checked item by item, and only a suspect goes to the full check."""
    for start in range(0, len(items), CHECK_SLICE):
        # A C loop never lets another thread run: the slices bound how long the encoder's other threads (the one
        # sending a chunk to the tokeniser workers, the one launching kernels) wait for the GIL (docs/performance.md).
        part = items[start : start + CHECK_SLICE]
        try:
            "".join(part).encode("utf-8")  # TypeError at an item that is not a string, UnicodeError at a surrogate
            if all(map(_strip_blank, part)):
                continue
        except (TypeError, UnicodeError):
            pass
        for i, s in enumerate(part, offset + start):
            if type(s) is not str or _BLANK.fullmatch(s) is not None or _SURROGATE.search(s):  # as check_sentence
                check_sentence(i, s, what=what)


def validate_sentences(sentences: Iterable[object], *, what: str = "sentence") -> list[str]:
    """Check that every item is a non-blank string and return them as a list."""
    items = sentence_list(sentences, what=what)
    check_sentences(items, what=what)
    return items


def check_finite(x: np.ndarray, *, what: str, first_row: int = 0) -> None:
    """Raise naming the first bad row and column if ``x`` holds NaN or Inf (rows counted from ``first_row``: where
    ``x`` starts in a stream)."""
    # In blocks of rows: a boolean mask of a million embeddings would cost as much memory as a float32 copy.
    step = max(1, (1 << 22) // max(1, x.shape[-1])) if x.ndim == 2 else max(1, len(x))
    for start in range(0, len(x), step):
        finite = np.isfinite(x[start : start + step])
        if finite.all():
            continue
        row, col = (int(v) for v in np.argwhere(~finite)[0]) if x.ndim == 2 else (int(np.argmin(finite)), 0)
        row += first_row + start
        raise InputError(
            f"{what} contain NaN or Inf (first at row {row}, column {col}); the model or its input is broken"
        )


def output_limit(input_absmax: float) -> float:
    """Bound on the absolute value of a calibrated coordinate of inputs whose largest absolute value is
    ``input_absmax``: :data:`OUTPUT_LIMIT` times ``max(1, input_absmax)`` (1: the scale of standardised outputs)."""
    return OUTPUT_LIMIT * max(1.0, float(input_absmax))


def check_calibrated(z: np.ndarray, x: np.ndarray, *, what: str = "the calibrator") -> None:
    """Raise if calibrated vectors ``z`` [N, D'] of finite inputs ``x`` [N, D] hold NaN, Inf or a coordinate beyond
    :func:`output_limit`, naming the row and column of the worst value: the map overflows or its weights are
    corrupted."""
    if not z.size:
        return
    limit = output_limit(max(float(x.max()), -float(x.min()))) if x.size else OUTPUT_LIMIT
    if float(z.max()) <= limit and -float(z.min()) <= limit:  # NaN fails both; no temporary arrays
        return
    raise_calibrated(z, limit, what=what)


def raise_calibrated(z: np.ndarray, limit: float, *, what: str, first_row: int = 0, source: str = "") -> NoReturn:
    """Raise :func:`check_calibrated`'s error (also the encoder's on-device check's) at the worst value of ``z``
    [N, D'] (NaN/Inf first, then the largest magnitude), its row counted from ``first_row``; ``source`` says where
    the embeddings came from (``"from MODEL "``)."""
    magnitude = np.where(np.isfinite(z), np.abs(z), np.inf)
    row, col = (int(v) for v in np.unravel_index(int(np.argmax(magnitude)), z.shape))
    value = float(z[row, col])
    found = "NaN or Inf" if not np.isfinite(value) else f"{value:.3g}, beyond the plausible {limit:.3g},"
    raise InputError(
        f"{what} turned finite embeddings {source}into {found} at row {first_row + row}, column {col}: it overflows "
        "on these inputs or its weights are corrupted; refit it on embeddings like them, or reload it from a "
        "verified copy"
    )


def check_array(
    x: Any,
    *,
    n_features: int | None = None,
    what: str = "X",
    min_rows: int = 1,
    dtype: type = np.float64,
    owner: str = "this calibrator",
    max_magnitude: float | None = MAX_INPUT_MAGNITUDE,
) -> np.ndarray:
    """An embedding matrix as ``dtype`` [N, D] (no copy if it has it), checked: dense, 2-D, numeric, finite, with
    ``n_features`` columns if given, and nothing beyond ``max_magnitude`` (``None``: any). Messages use
    scikit-learn's wording for the same faults (``owner`` names the estimator), so code written against it
    recognises them. InputTypeError (also a ``TypeError``) for items that are not numbers, else InputError.
    """
    import scipy.sparse

    if scipy.sparse.issparse(x):
        raise InputError(f"{what} is a sparse matrix; calibrators take dense embeddings (convert with .toarray())")
    try:
        arr = np.asarray(x)
        if not np.iscomplexobj(arr):  # a cast to float would drop the imaginary parts with no more than a warning
            arr = arr.astype(dtype, copy=False)
    except TypeError as e:
        raise InputTypeError(f"{what} is not a numeric array: {e}") from None
    except ValueError as e:
        raise InputError(f"{what} is not a numeric array: {e}") from None
    if np.iscomplexobj(arr):
        raise InputError(f"Complex data not supported: {what} holds complex numbers; embeddings are real")
    if arr.ndim != 2:
        raise InputError(f"{what} must be 2-D [n_samples, n_features], got shape {arr.shape}")
    if arr.shape[0] < min_rows:
        raise InputError(
            f"{what} has {arr.shape[0]} sample(s) (shape={arr.shape}) while a minimum of {min_rows} is required."
        )
    if arr.shape[1] < 1 and arr.shape[0]:
        raise InputError(f"{what} has 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required.")
    if n_features is not None and arr.shape[1] != n_features:
        raise InputError(f"{what} has {arr.shape[1]} features, but {owner} is expecting {n_features} features as input")
    check_finite(arr, what=what)
    largest = float(np.abs(arr).max()) if arr.size and max_magnitude is not None else 0.0
    if max_magnitude is not None and largest > max_magnitude:
        raise InputError(
            f"{what} holds values of magnitude up to {largest:.3g}; above {max_magnitude:.0e} their squares "
            "overflow float64, so they cannot be calibrated (embeddings are usually below 1e3: check how they were "
            "made)"
        )
    return arr


def check_positive_int(name: str, value: object) -> int:
    """``value`` if it is an integer >= 1 (not a bool), else InputError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_epochs(epochs: float) -> float:
    """``epochs`` as a float, refused unless finite and positive (``inf`` would never end, ``nan`` never start)."""
    try:
        value = float(epochs)
    except (TypeError, ValueError):
        raise InputError(f"epochs must be a positive number, got {epochs!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"epochs must be a positive, finite number (fractions allowed), got {epochs!r}")
    return value


def means_local(name: str, *, bare: bool = True) -> bool:
    """Whether ``name``, no existing path, can only have meant a local folder (a typo, which is then not looked up
    on the Hub): it starts with ``.``, ``/`` or ``~``, has more than two parts (a hub id is ``name`` or
    ``org/name``), its first folder exists here (``runs/my-flwo``), or it is a bare name and ``bare`` (a bertflow
    model on the Hub is always ``user/name``; an encoder may be ``bert-base-uncased``)."""
    parts = name.replace("\\", "/").split("/")
    if len(parts) > 2 or name.startswith((".", "/", "~")) or (os.sep == "\\" and ":" in name):
        return True
    return bare if len(parts) == 1 else Path(parts[0]).expanduser().is_dir()
