"""Reading sentences and sentence pairs, and loading the STS evaluation data.

Two layers live here:

* Generic, streaming readers for user files (:func:`iter_lines`, :func:`read_sentences`,
  :func:`read_tsv_column`, :func:`read_pairs`). They decode UTF-8 line by line, strip only the line
  terminator (``"\\n"`` or ``"\\r\\n"``) and never touch the rest of a line: leading and trailing spaces and
  ``"`` are part of a sentence. Every problem with a file's content is an :class:`~bertflow.errors.InputError`
  naming the file and the 1-based line number.
* The STS benchmark layer (:data:`STS_TASKS`, :func:`resolve_data_dir`, :func:`load_sts_task`,
  :func:`load_sts_tasks`, :func:`load_nli_sentences`, :func:`download_sts`). It reads the plain TSV layout
  described in ``shared/data/sts/README.md``: one ``score<TAB>sentence1<TAB>sentence2`` file per subset or
  split, in the folders ``STS12`` … ``STS16``, ``STSBenchmark``, ``SICK`` and ``NLI``.
"""

from __future__ import annotations

import gzip
import io
import logging
import math
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from bertflow.errors import DataNotFoundError, InputError
from bertflow.serialization import atomic_file
from bertflow.validation import is_blank

__all__ = [
    "EncodingErrors",
    "SentencePairs",
    "iter_lines",
    "read_sentences",
    "read_tsv_column",
    "read_pairs",
    "STS_TASKS",
    "STS_TASK_FOLDERS",
    "OFFICIAL_EVAL_PAIRS",
    "DATA_DIR_ENV",
    "DEFAULT_CACHE_DIR",
    "StsTask",
    "canonical_task_name",
    "resolve_data_dir",
    "load_sts_task",
    "load_sts_tasks",
    "load_nli_sentences",
    "download_sts",
]

logger = logging.getLogger(__name__)

EncodingErrors = Literal["strict", "replace"]
"""How undecodable bytes are handled: ``"strict"`` raises InputError, ``"replace"`` substitutes U+FFFD."""

_BOM = "\ufeff"

# ---------------------------------------------------------------------------------------------------------
# Generic readers
# ---------------------------------------------------------------------------------------------------------


def _check_errors_mode(errors: str) -> None:
    if errors not in ("strict", "replace"):
        raise InputError(f"errors must be 'strict' or 'replace', got {errors!r}")


_GZIP_MAGIC = b"\x1f\x8b"


def _open_binary(path: str | Path) -> io.BufferedIOBase:
    """Open ``path`` for binary reading, turning OS errors into InputError with the path in the message.

    A gzip file (recognised by its magic bytes, whatever its name) is decompressed while it is read, so a
    ``corpus.txt.gz`` needs no unpacking first. ``"-"`` is standard input, read as it comes (not decompressed; a
    duplicate of its descriptor, so closing the file leaves ``sys.stdin`` open).
    """
    p = Path(path)
    if str(path) == "-":
        return open(os.dup(sys.stdin.fileno()), "rb")  # noqa: SIM115 - the caller closes it
    try:
        fh = open(p, "rb")  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        raise InputError(f"cannot read {p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"cannot read {p}: it is a directory, expected a text file") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        is_gzip = fh.peek(2)[:2] == _GZIP_MAGIC
    except OSError as exc:
        fh.close()
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    if not is_gzip:
        return fh
    # Reopened by name so that the GzipFile owns (and closes) its file.
    fh.close()
    try:
        return gzip.open(p, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None


def _raw_lines(fh: io.BufferedIOBase, path: Path) -> Iterator[bytes]:
    """The lines of an open binary file; a read error or a corrupt or truncated gzip stream becomes an InputError
    naming the file."""
    try:
        yield from fh
    except (OSError, EOFError, zlib.error) as exc:
        what = "corrupt or truncated gzip data" if isinstance(fh, gzip.GzipFile) else "read error"
        raise InputError(f"cannot read {path}: {what} ({exc})") from None


def _looks_utf16(raw: bytes) -> bool:
    """Whether a line's bytes look like UTF-16 text read as UTF-8: at least a third of them NUL, nearly all at even
    or nearly all at odd positions (ASCII or Latin-1 text in UTF-16 has a NUL beside every character; NUL bytes in
    real UTF-8 text are rare and not aligned). Only lines with a NUL get here."""
    if len(raw) < 2:
        return False
    even, odd = raw[0::2].count(0), raw[1::2].count(0)
    nuls = even + odd
    return 3 * nuls >= len(raw) and 10 * max(even, odd) >= 9 * nuls and nuls < len(raw)


def check_not_utf16(raw: bytes, path: Path, number: int) -> None:
    """Raise :class:`InputError` naming ``path`` and line ``number`` if the line's bytes (terminator removed) look
    like UTF-16 (:func:`_looks_utf16`); a fast byte search when the line has no NUL, the usual case."""
    if b"\x00" in raw and _looks_utf16(raw):
        raise InputError(
            f"{path}: line {number} has a NUL byte every other byte: the file is UTF-16 (without a byte-order "
            "mark), not UTF-8; re-encode it as UTF-8 (e.g. iconv -f UTF-16LE -t UTF-8)"
        )


def iter_lines(path: str | Path, errors: EncodingErrors = "strict") -> Iterator[tuple[int, str]]:
    """Stream the lines of a UTF-8 text file, plain or gzip-compressed.

    The file is read in binary and split on ``b"\\n"`` only (so U+2028, form feeds or a lone ``"\\r"``
    inside a line never split it; UTF-8 never uses byte 0x0A inside a multi-byte character, so splitting
    before decoding is safe). Only the terminator ``"\\n"`` or ``"\\r\\n"`` is removed; a UTF-8 BOM at the
    very start of the file is dropped. Nothing else is stripped. A line with a NUL byte every other byte is UTF-16
    without a byte-order mark (valid UTF-8 byte by byte, so it would otherwise be read as garbage): refused.

    Args:
        path: The text file.
        errors: ``"strict"`` raises on invalid UTF-8; ``"replace"`` decodes each bad byte as U+FFFD.

    Yields:
        ``(line_number, text)``: the 1-based line number and the decoded line without its terminator.

    Raises:
        InputError: The file cannot be opened, or (``errors="strict"``) a line is not valid UTF-8; the
            message names the file, the line number, the column and the offending byte.
    """
    _check_errors_mode(errors)
    p = Path(path)
    with _open_binary(p) as fh:
        for number, raw in enumerate(_raw_lines(fh, p), start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            check_not_utf16(raw, p, number)
            try:
                text = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1]
                raise InputError(
                    f"{p}: line {number} is not valid UTF-8 (byte 0x{bad.hex()} at byte column "
                    f"{exc.start + 1}: {exc.reason}). Re-encode the file as UTF-8, or pass "
                    f"errors='replace' (CLI: --encoding-errors replace) to read undecodable bytes as U+FFFD."
                ) from None
            if number == 1 and text.startswith(_BOM):
                text = text[1:]
            yield number, text


def read_sentences(
    path: str | Path,
    *,
    errors: EncodingErrors = "strict",
    skip_blank: bool = True,
    unique: bool = False,
) -> list[str]:
    """Read a file with one sentence per line.

    Streams the file once (suitable for files with millions of lines or very long lines). Sentences are
    kept exactly as written apart from the line terminator.

    Args:
        path: UTF-8 text file (a leading BOM is ignored).
        errors: How to treat invalid UTF-8, see :func:`iter_lines`.
        skip_blank: Skip blank lines: empty, or only whitespace or invisible characters (zero-width, U+FEFF, NUL:
            :func:`bertflow.validation.is_blank`); their count is logged at INFO. If False, such a
            line raises InputError naming its line number.
        unique: Drop repeated sentences, keeping the first occurrence (and its position).

    Returns:
        The sentences, in file order.

    Raises:
        InputError: Unreadable or undecodable file, a blank line with ``skip_blank=False``, or no sentences.
    """
    p = Path(path)
    sentences: list[str] = []
    seen: set[str] = set()
    n_blank = 0
    n_duplicate = 0
    for number, text in iter_lines(p, errors=errors):
        if is_blank(text):
            if not skip_blank:
                raise InputError(
                    f"{p}: line {number} is empty or only whitespace or invisible characters (zero-width, U+FEFF, "
                    "NUL); remove it or allow skipping blank lines"
                )
            n_blank += 1
            continue
        if unique:
            if text in seen:
                n_duplicate += 1
                continue
            seen.add(text)
        sentences.append(text)
    if n_blank:
        logger.info("%s: skipped %d blank line(s)", p, n_blank)
    if n_duplicate:
        logger.info("%s: dropped %d duplicate sentence(s)", p, n_duplicate)
    if not sentences:
        detail = f" ({n_blank} blank line(s) skipped)" if n_blank else ""
        raise InputError(f"no sentences in {p}{detail}")
    return sentences


def _iter_tsv_rows(path: Path, errors: EncodingErrors) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, fields)`` for every non-empty line, split on TAB only (no quoting)."""
    n_empty = 0
    for number, text in iter_lines(path, errors=errors):
        if text == "":
            # A stray empty line (typically a second trailing newline) carries no row.
            n_empty += 1
            continue
        yield number, text.split("\t")
    if n_empty:
        logger.info("%s: skipped %d empty line(s)", path, n_empty)


def read_tsv_column(
    path: str | Path,
    column: str | int,
    *,
    header: bool = True,
    errors: EncodingErrors = "strict",
) -> list[str]:
    """Read one column of a TAB-separated file.

    Lines are split on TAB only; ``"`` has no special meaning and values are not stripped. Completely empty
    lines are skipped. Rows may have more fields than needed.

    Args:
        path: UTF-8 TSV file.
        column: Header name (needs ``header=True``) or 0-based column index.
        header: Whether the first line is a header (it is then not returned).
        errors: How to treat invalid UTF-8, see :func:`iter_lines`.

    Returns:
        The column's values, one per data row, in file order.

    Raises:
        InputError: Unknown column name (the message lists the header), a negative index, a row with too
            few fields (the message names the line and the column), or no data rows.
    """
    p = Path(path)
    rows = _iter_tsv_rows(p, errors)
    index: int
    label: str
    if isinstance(column, bool) or not isinstance(column, (str, int)):
        raise InputError(f"column must be a header name or a 0-based index, got {column!r}")
    header_fields: list[str] | None = None
    if header:
        first = next(rows, None)
        if first is None:
            raise InputError(f"{p} is empty: expected a header line")
        header_fields = first[1]
    if isinstance(column, str):
        if header_fields is None:
            raise InputError(f"column {column!r} is a name, but header=False; pass a 0-based index instead")
        if column not in header_fields:
            available = ", ".join(repr(name) for name in header_fields)
            raise InputError(f"{p}: no column named {column!r}; the header has: {available}")
        index, label = header_fields.index(column), repr(column)
    else:
        if column < 0:
            raise InputError(f"column index must be >= 0, got {column}")
        if header_fields is not None and column >= len(header_fields):
            available = ", ".join(f"{i}={name!r}" for i, name in enumerate(header_fields))
            raise InputError(f"{p}: column index {column} is out of range; the header has: {available}")
        index = column
        label = f"{column} ({header_fields[column]!r})" if header_fields is not None else str(column)
    values: list[str] = []
    for number, fields in rows:
        if len(fields) <= index:
            raise InputError(
                f"{p}: line {number} has {len(fields)} TAB-separated field(s), so column {label} "
                f"(needs at least {index + 1}) is missing"
            )
        values.append(fields[index])
    if not values:
        raise InputError(f"no data rows in {p}")
    return values


@dataclass
class SentencePairs:
    """Aligned sentence pairs, optionally with a gold score (STS) or a label (NLI) per pair.

    Attributes:
        sentences1: First sentence of each pair, length N.
        sentences2: Second sentence of each pair, length N.
        scores: Gold similarity per pair, float64 array of shape (N,) on the data set's own scale (0-5 for
            STS, 1-5 for SICK), or None when the file has labels instead of scores.
        labels: Class label per pair (e.g. ``"entailment"``) for NLI files, else None.
        columns: Every column of the file by header name, in file order, as raw text (``read_pairs(...,
            keep_columns=True)``; None otherwise): what a tool that adds a column writes back.
    """

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray | None = None
    labels: list[str] | None = None
    columns: dict[str, list[str]] | None = None

    def __post_init__(self) -> None:
        n = len(self.sentences1)
        if len(self.sentences2) != n:
            raise InputError(f"sentences1 has {n} entries but sentences2 has {len(self.sentences2)}")
        if self.scores is not None:
            self.scores = np.asarray(self.scores, dtype=np.float64)
            if self.scores.shape != (n,):
                raise InputError(f"scores must have shape ({n},), got {self.scores.shape}")
        if self.labels is not None and len(self.labels) != n:
            raise InputError(f"labels has {len(self.labels)} entries, expected {n}")

    def __len__(self) -> int:
        return len(self.sentences1)

    def sentences(self) -> Iterator[str]:
        """Yield every sentence, pair by pair (``s1, s2`` of pair 0, then of pair 1, ...)."""
        for s1, s2 in zip(self.sentences1, self.sentences2, strict=True):
            yield s1
            yield s2


def read_pairs(
    path: str | Path, *, errors: EncodingErrors = "strict", require_target: bool = True, keep_columns: bool = False
) -> SentencePairs:
    """Read a pair TSV with header ``score|label<TAB>sentence1<TAB>sentence2`` (the STS data format).

    Every data row must have exactly as many fields as the header (a TAB inside a sentence would otherwise
    silently shift columns). Scores are parsed with ``float()``; sentences are kept verbatim. Other columns (an
    ``id``, say) are allowed, and ignored unless ``keep_columns``.

    Args:
        path: UTF-8 TSV file whose header contains ``sentence1``, ``sentence2`` and ``score`` or ``label``.
        errors: How to treat invalid UTF-8, see :func:`iter_lines`.
        require_target: refuse a file without a ``score`` or ``label`` column; ``False`` reads sentence pairs
            alone (``scores`` and ``labels`` are then None).
        keep_columns: also return every column as text in :attr:`SentencePairs.columns`.

    Returns:
        The pairs; ``scores`` is set for a ``score`` column, ``labels`` for a ``label`` column.

    Raises:
        InputError: Missing or wrong header, a row with the wrong number of fields, a non-numeric or
            non-finite score, an empty sentence (each with its line number), or no rows.
    """
    p = Path(path)
    rows = _iter_tsv_rows(p, errors)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{p} is empty: expected the header score<TAB>sentence1<TAB>sentence2")
    header = first[1]
    target = "score" if "score" in header else "label" if "label" in header else None
    if (target is None and require_target) or "sentence1" not in header or "sentence2" not in header:
        wanted = "score (or label), sentence1 and sentence2" if require_target else "sentence1 and sentence2"
        raise InputError(
            f"{p}: line {first[0]} must be a header with the columns {wanted}, TAB-separated; got {header!r}"
        )
    i1, i2 = header.index("sentence1"), header.index("sentence2")
    i_target = header.index(target) if target is not None else None
    columns: list[list[str]] = [[] for _ in header]
    s1: list[str] = []
    s2: list[str] = []
    targets: list[str] = []
    scores: list[float] = []
    for number, fields in rows:
        if len(fields) != len(header):
            raise InputError(
                f"{p}: line {number} has {len(fields)} TAB-separated field(s), expected {len(header)} "
                f"({', '.join(header)})"
            )
        a, b = fields[i1], fields[i2]
        t = fields[i_target] if i_target is not None else ""
        if is_blank(a) or is_blank(b):
            which = "sentence1" if is_blank(a) else "sentence2"
            raise InputError(f"{p}: line {number}: {which} is empty (or only whitespace or invisible characters)")
        if target == "score":
            try:
                value = float(t)
            except ValueError:
                raise InputError(f"{p}: line {number}: score {t!r} is not a number") from None
            if not math.isfinite(value):
                raise InputError(f"{p}: line {number}: score {t!r} is not finite")
            scores.append(value)
        elif target == "label":
            targets.append(t)
        s1.append(a)
        s2.append(b)
        if keep_columns:
            for column, field in zip(columns, fields, strict=True):
                column.append(field)
    if not s1:
        raise InputError(f"no sentence pairs in {p}")
    kept = dict(zip(header, columns, strict=True)) if keep_columns else None
    if target == "score":
        return SentencePairs(s1, s2, np.asarray(scores, dtype=np.float64), columns=kept)
    return SentencePairs(s1, s2, None, targets if target == "label" else None, columns=kept)


def _distinct(sentences: Iterable[str]) -> list[str]:
    """Distinct strings in order of first occurrence."""
    return list(dict.fromkeys(sentences))


# ---------------------------------------------------------------------------------------------------------
# STS benchmark data
# ---------------------------------------------------------------------------------------------------------

STS_TASKS: tuple[str, ...] = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")
"""The seven STS tasks of the BERT-flow / SimCSE evaluation, in the papers' column order."""

STS_TASK_FOLDERS: dict[str, str] = {
    "STS12": "STS12",
    "STS13": "STS13",
    "STS14": "STS14",
    "STS15": "STS15",
    "STS16": "STS16",
    "STS-B": "STSBenchmark",
    "SICK-R": "SICK",
}
"""Folder of each task inside the data directory."""

OFFICIAL_EVAL_PAIRS: dict[str, int] = {
    "STS12": 3108,
    "STS13": 1500,
    "STS14": 3750,
    "STS15": 3000,
    "STS16": 1186,
    "STS-B": 1379,
    "SICK-R": 4927,
}
"""Scored evaluation pairs per task as SentEval evaluates them (STS13 without SMT; STS-B/SICK-R: test)."""

DATA_DIR_ENV = "BERTFLOW_DATA_DIR"
"""Environment variable naming the STS data folder."""

DEFAULT_CACHE_DIR = Path("~/.cache/bertflow/sts")
"""Where :func:`download_sts` builds the data by default (``~`` is expanded at call time)."""

_SPLIT_FILES: dict[str, dict[str, str]] = {
    "STS-B": {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
    "SICK-R": {"train": "train.tsv", "dev": "trial.tsv", "test": "test.tsv"},
}

_ALIASES: dict[str, str] = {
    **{name.replace("-", "").upper(): name for name in STS_TASKS},
    "STSBENCHMARK": "STS-B",
    "SICK": "SICK-R",
    "SICKRELATEDNESS": "SICK-R",
}

_HOW_TO_GET_DATA = (
    "Point bertflow at a local copy of the STS data with --data-dir PATH or the environment variable "
    f"{DATA_DIR_ENV}=PATH (the folder holding STS12 ... STS16, STSBenchmark, SICK), or, with internet "
    "access, download it once with `bertflow download-sts` (Python: bertflow.data.download_sts()), which "
    f"builds it in {DEFAULT_CACHE_DIR}."
)

_USE_LOCAL_COPY = (
    "Without network access, get the data folder (STS12 ... STS16, STSBenchmark, SICK as TSV files) "
    "some other way and point bertflow at it with --data-dir PATH or the environment variable "
    f"{DATA_DIR_ENV}=PATH."
)


def canonical_task_name(name: str) -> str:
    """Map a task name or common alias (``"stsb"``, ``"STSBenchmark"``, ``"sick"``) to its STS_TASKS name.

    Raises:
        InputError: Unknown name; the message lists the valid names.
    """
    if not isinstance(name, str):
        raise InputError(f"task name must be a string, got {type(name).__name__}")
    key = name.replace("-", "").replace("_", "").replace(" ", "").upper()
    if key not in _ALIASES:
        raise InputError(f"unknown STS task {name!r}; expected one of {', '.join(STS_TASKS)}")
    return _ALIASES[key]


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """Find the STS data folder.

    Order: the explicit ``data_dir``; else the environment variable ``BERTFLOW_DATA_DIR``; else the first
    existing folder among ``./shared/data/sts``, ``../shared/data/sts`` (relative to the current directory)
    and ``~/.cache/bertflow/sts`` (where :func:`download_sts` puts it).

    Args:
        data_dir: Explicit folder; it must exist.

    Returns:
        The folder as an absolute path (so a later change of directory does not invalidate it).

    Raises:
        DataNotFoundError: The explicit or environment folder does not exist, or no default folder exists;
            the message says how to point at a local copy and how to download the data.
    """
    if data_dir is not None:
        p = Path(data_dir).expanduser()
        if not p.is_dir():
            raise DataNotFoundError(f"STS data folder {p} does not exist. {_HOW_TO_GET_DATA}")
        return p.resolve()
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise DataNotFoundError(f"{DATA_DIR_ENV}={env} is not an existing folder. {_HOW_TO_GET_DATA}")
        return p.resolve()
    candidates = [Path("shared/data/sts"), Path("../shared/data/sts"), DEFAULT_CACHE_DIR.expanduser()]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise DataNotFoundError(f"no STS data folder found (looked in {tried}). {_HOW_TO_GET_DATA}")


@dataclass
class StsTask:
    """One STS task: the pairs it is evaluated on and the splits its sentences can be fitted on.

    Attributes:
        name: Task name from :data:`STS_TASKS`, e.g. ``"STS12"``.
        eval_subsets: Evaluation pairs by subset name. STS12-16: every subset of the year (e.g. ``"MSRpar"``);
            STS-B and SICK-R: ``{"test": ...}``.
        splits: All available pairs by split. STS-B and SICK-R: ``train``, ``dev`` (SICK's ``trial``) and
            ``test``; STS12-16 (test-only data sets): the same subsets as ``eval_subsets``.
    """

    name: str
    eval_subsets: dict[str, SentencePairs]
    splits: dict[str, SentencePairs] = field(default_factory=dict)

    @property
    def n_eval_pairs(self) -> int:
        """Number of evaluation pairs over all subsets."""
        return sum(len(pairs) for pairs in self.eval_subsets.values())

    @property
    def has_train_split(self) -> bool:
        """Whether the task has a labelled train split (STS-B and SICK-R only)."""
        return self.name in _SPLIT_FILES

    def fit_sentences(self, regime: Literal["target", "train"] = "target") -> list[str]:
        """Distinct unlabelled sentences to fit a calibrator (flow, whitening) on.

        Args:
            regime: ``"target"``: every sentence of the task, i.e. train + dev + test for STS-B and SICK-R and
                all subsets for STS12-16. This is BERT-flow's transductive default (it sees the test
                sentences, never the scores). ``"train"``: the train split only (STS-B and SICK-R).
                The "nli" regime is :func:`load_nli_sentences`.

        Returns:
            Distinct sentences in order of first occurrence (split by split, pair by pair, ``s1`` before
            ``s2``).

        Raises:
            InputError: Unknown regime, or ``"train"`` for a task without a train split (STS12-16).
        """
        if regime == "target":
            chosen = list(self.splits.values()) or list(self.eval_subsets.values())
        elif regime == "train":
            if not self.has_train_split or "train" not in self.splits:
                raise InputError(
                    f"{self.name} has no train split (STS12-16 are test-only); use regime='target' or fit "
                    "on another corpus (e.g. load_nli_sentences())"
                )
            chosen = [self.splits["train"]]
        else:
            raise InputError(f"regime must be 'target' or 'train', got {regime!r}")
        return _distinct(s for pairs in chosen for s in pairs.sentences())

    def eval_sentences(self) -> list[str]:
        """Distinct sentences of the evaluation pairs, in order of first occurrence."""
        return _distinct(s for pairs in self.eval_subsets.values() for s in pairs.sentences())


def _read_data_file(path: Path, errors: EncodingErrors = "strict") -> SentencePairs:
    if not path.is_file():
        raise DataNotFoundError(f"missing STS data file {path}. {_HOW_TO_GET_DATA}")
    return read_pairs(path, errors=errors)


def load_sts_task(name: str, data_dir: str | Path | None = None) -> StsTask:
    """Load one STS task from the TSV layout.

    STS12-16 subsets are every ``*.tsv`` in the year's folder, ordered case-insensitively by name (which is
    SentEval's order). A pair count that differs from the official one is logged as a warning, since
    results would then not be comparable with published numbers.

    Args:
        name: Task name from :data:`STS_TASKS` or an alias accepted by :func:`canonical_task_name`.
        data_dir: Data folder; see :func:`resolve_data_dir` for the default.

    Returns:
        The task with its evaluation subsets and splits.

    Raises:
        InputError: Unknown task name or malformed file.
        DataNotFoundError: The data folder, the task folder or a split file is missing.
    """
    task = canonical_task_name(name)
    root = resolve_data_dir(data_dir)
    folder = root / STS_TASK_FOLDERS[task]
    if not folder.is_dir():
        raise DataNotFoundError(f"{task}: folder {folder} does not exist. {_HOW_TO_GET_DATA}")
    if task in _SPLIT_FILES:
        splits = {split: _read_data_file(folder / fname) for split, fname in _SPLIT_FILES[task].items()}
        subsets = {"test": splits["test"]}
    else:
        files = sorted(folder.glob("*.tsv"), key=lambda f: (f.name.lower(), f.name))
        if not files:
            raise DataNotFoundError(f"{task}: no subset files (*.tsv) in {folder}. {_HOW_TO_GET_DATA}")
        subsets = {f.stem: _read_data_file(f) for f in files}
        splits = dict(subsets)
    result = StsTask(task, subsets, splits)
    if result.n_eval_pairs != OFFICIAL_EVAL_PAIRS[task]:
        logger.warning(
            "%s has %d evaluation pairs in %s, the official count is %d: scores are not comparable with "
            "published results",
            task,
            result.n_eval_pairs,
            folder,
            OFFICIAL_EVAL_PAIRS[task],
        )
    return result


def load_sts_tasks(names: Sequence[str] = STS_TASKS, data_dir: str | Path | None = None) -> dict[str, StsTask]:
    """Load several STS tasks (default: all seven) keyed by canonical task name, in the given order."""
    root = resolve_data_dir(data_dir)
    tasks: dict[str, StsTask] = {}
    for name in names:
        task = load_sts_task(name, root)
        tasks[task.name] = task
    return tasks


def load_nli_sentences(data_dir: str | Path | None = None) -> list[str]:
    """Distinct sentences of SNLI dev + test (``NLI/snli_dev.tsv``, ``NLI/snli_test.tsv``): the "nli" regime.

    BERT-flow's NLI setting fits the flow on the sentences of full SNLI + MultiNLI (about 1M pairs). Those
    corpora are not available in the shipped data folder, so SNLI dev+test (19,666 pairs, about 25.7k
    distinct sentences, SentEval-tokenized text) is a stand-in: good for a generic, non-target fitting
    corpus, but not the paper's exact setting.

    Args:
        data_dir: Data folder; see :func:`resolve_data_dir`.

    Returns:
        Distinct sentences in order of first occurrence (dev before test, pair by pair).

    Raises:
        DataNotFoundError: The NLI files are missing.
    """
    root = resolve_data_dir(data_dir)
    parts = [_read_data_file(root / "NLI" / fname) for fname in ("snli_dev.tsv", "snli_test.tsv")]
    return _distinct(s for pairs in parts for s in pairs.sentences())


# ---------------------------------------------------------------------------------------------------------
# Downloader
# ---------------------------------------------------------------------------------------------------------

# The original release archives SentEval's data script downloads (see its get_transfer_data.bash).
# Each year: archive URL, name pattern of the sentence and gold files, subsets (STS13 without the
# LDC-licensed SMT subset, as SentEval and BERT-flow).
_SEMEVAL_YEARS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "STS12": (
        "http://ixa2.si.ehu.es/stswiki/images/4/40/STS2012-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    ),
    "STS13": (
        "http://ixa2.si.ehu.es/stswiki/images/2/2f/STS2013-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("FNWN", "headlines", "OnWN"),
    ),
    "STS14": (
        "http://ixa2.si.ehu.es/stswiki/images/8/8c/STS2014-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    ),
    "STS15": (
        "http://ixa2.si.ehu.es/stswiki/images/d/da/STS2015-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("answers-forums", "answers-students", "belief", "headlines", "images"),
    ),
    "STS16": (
        "http://ixa2.si.ehu.es/stswiki/images/9/98/STS2016-en-test.zip",
        "STS2016.input.{}.txt",
        "STS2016.gs.{}.txt",
        ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
    ),
}
_STSB_URL = "http://ixa2.si.ehu.es/stswiki/images/4/48/Stsbenchmark.tar.gz"
_SICK_URLS: dict[str, str] = {
    "train.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_train.txt",
    "trial.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_trial.txt",
    "test.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_test_annotated.txt",
}
_SNLI_URL = "https://nlp.stanford.edu/projects/snli/snli_1.0.zip"
_COMPLETE_MARKER = ".bertflow-download-complete"


def _clean_field(text: str) -> str:
    # The TSV format cannot hold these characters inside a field; the README's rule is "replace by a space".
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _decode_source(raw: bytes, name: str) -> list[str]:
    """Decode a source file into lines split on LF only, without terminators (a CR before LF is dropped)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("%s is not valid UTF-8; undecodable bytes are replaced by U+FFFD", name)
        text = raw.decode("utf-8", errors="replace")
    if text.startswith(_BOM):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _write_pairs_tsv(path: Path, header: str, rows: Iterable[tuple[str, str, str]]) -> int:
    """Write ``header`` then one ``score<TAB>s1<TAB>s2`` row per item, atomically; return the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_file(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(header + "\n")
        for score, s1, s2 in rows:
            fh.write(f"{_clean_field(score)}\t{_clean_field(s1)}\t{_clean_field(s2)}\n")
            n += 1
    return n


def _find_file(root: Path, name: str) -> Path:
    matches = sorted(p for p in root.rglob(name) if p.is_file())
    if not matches:
        raise DataNotFoundError(
            f"the downloaded archive has no file {name}; the source may have changed. {_USE_LOCAL_COPY}"
        )
    # Prefer the shallowest match: some mirrors nest processed copies deeper.
    return min(matches, key=lambda p: (len(p.parts), str(p)))


def _convert_semeval_year(
    src_dir: Path, dst_dir: Path, subsets: Sequence[str], input_pattern: str, gs_pattern: str
) -> dict[str, int]:
    """Convert SemEval ``STS.input.<subset>.txt`` + ``STS.gs.<subset>.txt`` files to ``<subset>.tsv``.

    The input files hold ``sentence1<TAB>sentence2[<TAB>source notes...]``; the gold file holds one score
    per line, empty for pairs that were not scored. Unscored pairs are dropped (as SentEval does); scores
    and sentences are otherwise copied verbatim.

    Args:
        src_dir: Folder that contains (at any depth) the unpacked input and gold files.
        dst_dir: Year folder to write ``<subset>.tsv`` into.
        subsets: Subset names to convert.
        input_pattern: File name of the sentences, with ``{}`` for the subset.
        gs_pattern: File name of the gold scores, with ``{}`` for the subset.

    Returns:
        Number of scored pairs written per subset.

    Raises:
        DataNotFoundError: A file is missing. InputError: the files disagree in length or are malformed.
    """
    counts: dict[str, int] = {}
    for subset in subsets:
        input_path = _find_file(src_dir, input_pattern.format(subset))
        gs_path = _find_file(src_dir, gs_pattern.format(subset))
        pairs = _decode_source(input_path.read_bytes(), str(input_path))
        gold = _decode_source(gs_path.read_bytes(), str(gs_path))
        if len(pairs) != len(gold):
            raise InputError(f"{input_path} has {len(pairs)} lines but {gs_path} has {len(gold)}; cannot align scores")
        rows: list[tuple[str, str, str]] = []
        for number, (line, score) in enumerate(zip(pairs, gold, strict=True), start=1):
            score = score.strip()
            if not score:
                continue
            fields = line.split("\t")
            if len(fields) < 2:
                raise InputError(f"{input_path}: line {number} has no TAB between the two sentences")
            try:
                float(score)
            except ValueError:
                raise InputError(f"{gs_path}: line {number}: score {score!r} is not a number") from None
            rows.append((score, fields[0], fields[1]))
        counts[subset] = _write_pairs_tsv(dst_dir / f"{subset}.tsv", "score\tsentence1\tsentence2", rows)
    return counts


def _convert_stsb_csv(src: Path, dst: Path) -> int:
    """Convert a raw STS Benchmark ``sts-<split>.csv`` (TAB-separated, no quoting) to the pair TSV.

    Columns are genre, filename, year, id, score, sentence1, sentence2 and optional licence fields; only
    score and the two sentences are kept.
    """
    rows: list[tuple[str, str, str]] = []
    for number, line in enumerate(_decode_source(src.read_bytes(), str(src)), start=1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise InputError(f"{src}: line {number} has {len(fields)} fields, expected at least 7")
        rows.append((fields[4].strip(), fields[5], fields[6]))
    return _write_pairs_tsv(dst, "score\tsentence1\tsentence2", rows)


def _convert_sick(src: Path, dst: Path) -> int:
    """Convert an official SICK file (header pair_ID, sentence_A, sentence_B, relatedness_score, ...)."""
    lines = _decode_source(src.read_bytes(), str(src))
    if not lines:
        raise InputError(f"{src} is empty")
    header = lines[0].split("\t")
    try:
        i_a, i_b, i_s = (header.index(c) for c in ("sentence_A", "sentence_B", "relatedness_score"))
    except ValueError:
        raise InputError(f"{src}: unexpected SICK header {header!r}") from None
    rows: list[tuple[str, str, str]] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < len(header):
            raise InputError(f"{src}: line {number} has {len(fields)} fields, expected {len(header)}")
        rows.append((fields[i_s].strip(), fields[i_a], fields[i_b]))
    return _write_pairs_tsv(dst, "score\tsentence1\tsentence2", rows)


def _convert_snli_jsonl(src: Path, dst: Path) -> int:
    """Convert an SNLI 1.0 ``.jsonl`` split to ``label<TAB>sentence1<TAB>sentence2``, dropping gold ``-``."""
    import json

    rows: list[tuple[str, str, str]] = []
    for line in _decode_source(src.read_bytes(), str(src)):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("gold_label", "-") == "-":
            continue
        rows.append((record["gold_label"], record["sentence1"], record["sentence2"]))
    return _write_pairs_tsv(dst, "label\tsentence1\tsentence2", rows)


def _safe_extract(archive: Path, dest: Path) -> None:
    """Unpack a zip or tar archive into ``dest``, refusing members that would land outside it."""
    dest_resolved = dest.resolve()

    def _check(name: str) -> None:
        target = (dest / name).resolve()
        if dest_resolved != target and dest_resolved not in target.parents:
            raise InputError(f"{archive}: member {name!r} would be written outside the extraction folder")

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                _check(member)
            zf.extractall(dest)
        return
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for member in members:
                _check(member.name)
                if member.issym() or member.islnk():
                    raise InputError(f"{archive}: refusing link member {member.name!r}")
            tf.extractall(dest, members=members)
    except tarfile.TarError as exc:
        raise InputError(f"{archive} is neither a zip nor a tar archive ({exc})") from None


def _check_reachable(urls: Iterable[str], timeout: float) -> None:
    """Fail fast when the download hosts cannot be reached within ``timeout`` seconds (in total).

    urllib's timeout does not bound DNS resolution, so the probe runs in daemon threads with a hard deadline.
    Where urllib would go through a proxy (``http_proxy`` / ``https_proxy``), the proxy is probed instead.
    """
    proxies = urllib.request.getproxies()
    hosts: dict[tuple[str, int], str] = {}
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.hostname is None:
            raise DataNotFoundError(f"bad download URL {url!r}. {_USE_LOCAL_COPY}")
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        proxy = proxies.get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.hostname):
            proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            if proxy_parts.hostname:
                host = proxy_parts.hostname
                port = proxy_parts.port or (443 if proxy_parts.scheme == "https" else 80)
        hosts.setdefault((host, port), url)
    failures: dict[tuple[str, int], str] = {}
    lock = threading.Lock()  # late probes may still report while the result is being read

    def _probe(host: str, port: int) -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            with lock:
                failures[(host, port)] = str(exc) or type(exc).__name__

    threads = {key: threading.Thread(target=_probe, args=key, daemon=True) for key in hosts}
    for thread in threads.values():
        thread.start()
    # One deadline for all probes: they run in parallel, so the whole check takes at most ~timeout seconds.
    deadline = time.monotonic() + timeout
    for key, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            with lock:
                failures.setdefault(key, f"no answer within {timeout:g} s")
    with lock:
        reported = sorted(failures.items())
    if reported:
        detail = "; ".join(f"{host}:{port}: {why}" for (host, port), why in reported)
        raise DataNotFoundError(f"cannot download the STS data: network unreachable ({detail}). {_USE_LOCAL_COPY}")


def _download(url: str, dest: Path, timeout: float) -> Path:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out, length=1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        raise DataNotFoundError(f"downloading {url} failed ({exc}). {_USE_LOCAL_COPY}") from None
    return dest


def download_sts(
    cache_dir: str | Path | None = None,
    *,
    include_nli: bool = False,
    force: bool = False,
    connect_timeout: float = 5.0,
    read_timeout: float = 60.0,
) -> Path:
    """Download the original STS12-16, STS Benchmark and SICK releases and build the TSV layout.

    Sources are the archives SentEval's data script uses: the SemEval STS 2012-2016 English test packages
    (``STS.input.*`` / ``STS.gs.*``; STS13 without the LDC-licensed SMT subset), the STS Benchmark tarball
    (columns score, sentence1, sentence2 of ``sts-{train,dev,test}.csv``) and SICK (``SICK_train``,
    ``SICK_trial``, ``SICK_test_annotated``; relatedness score). Only scored pairs are kept, text is raw
    (not SentEval's tokenized and lowercased copy), and the pair counts are checked against the official
    ones. The reachability of every host is probed first, so without network the call fails within about
    ``connect_timeout`` seconds.

    Args:
        cache_dir: Output folder (default ``~/.cache/bertflow/sts``, one of the folders
            :func:`resolve_data_dir` looks in). Existing files of the layout are overwritten; nothing else
            in the folder is touched.
        include_nli: Also build ``NLI/snli_{dev,test}.tsv`` from the SNLI 1.0 zip (about 90 MB download).
            Its text is raw SNLI, not the SentEval-tokenized text of the shipped copy.
        force: Rebuild even if a previous download completed.
        connect_timeout: Seconds allowed for reaching the hosts.
        read_timeout: Seconds allowed for any single network read.

    Returns:
        The data folder, ready for ``load_sts_tasks(data_dir=...)``.

    Raises:
        DataNotFoundError: A host is unreachable or a download fails; the message says how to use a local
            copy instead.
        InputError: A downloaded file does not have the expected content.
    """
    target = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR.expanduser()
    marker = target / _COMPLETE_MARKER
    if marker.is_file() and not force and (not include_nli or (target / "NLI" / "snli_test.tsv").is_file()):
        logger.info("STS data already downloaded in %s", target)
        return target
    urls = [spec[0] for spec in _SEMEVAL_YEARS.values()] + [_STSB_URL, *_SICK_URLS.values()]
    if include_nli:
        urls.append(_SNLI_URL)
    _check_reachable(urls, connect_timeout)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataNotFoundError(f"cannot create {target} ({exc}). {_USE_LOCAL_COPY}") from None
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bertflow-sts-") as tmp_name:
        tmp = Path(tmp_name)
        for year, (url, input_pattern, gs_pattern, subsets) in _SEMEVAL_YEARS.items():
            logger.info("downloading %s from %s", year, url)
            unpacked = tmp / year
            unpacked.mkdir()
            _safe_extract(_download(url, tmp / f"{year}.zip", read_timeout), unpacked)
            per_subset = _convert_semeval_year(unpacked, target / year, subsets, input_pattern, gs_pattern)
            counts[year] = sum(per_subset.values())
        logger.info("downloading STS Benchmark from %s", _STSB_URL)
        stsb = tmp / "stsb"
        stsb.mkdir()
        _safe_extract(_download(_STSB_URL, tmp / "stsb.tar.gz", read_timeout), stsb)
        for split in ("train", "dev", "test"):
            csv_path = _find_file(stsb, f"sts-{split}.csv")
            n = _convert_stsb_csv(csv_path, target / "STSBenchmark" / f"{split}.tsv")
            if split == "test":
                counts["STS-B"] = n
        for fname, url in _SICK_URLS.items():
            logger.info("downloading SICK %s from %s", fname, url)
            n = _convert_sick(_download(url, tmp / f"sick-{fname}", read_timeout), target / "SICK" / fname)
            if fname == "test.tsv":
                counts["SICK-R"] = n
        if include_nli:
            logger.info("downloading SNLI 1.0 from %s", _SNLI_URL)
            snli = tmp / "snli"
            snli.mkdir()
            _safe_extract(_download(_SNLI_URL, tmp / "snli.zip", read_timeout), snli)
            for split in ("dev", "test"):
                jsonl = _find_file(snli, f"snli_1.0_{split}.jsonl")
                _convert_snli_jsonl(jsonl, target / "NLI" / f"snli_{split}.tsv")
    wrong = {t: n for t, n in counts.items() if n != OFFICIAL_EVAL_PAIRS[t]}
    if wrong:
        detail = ", ".join(f"{t}: {n} (official {OFFICIAL_EVAL_PAIRS[t]})" for t, n in wrong.items())
        raise InputError(f"downloaded data in {target} has unexpected pair counts: {detail}")
    marker.write_text("complete\n", encoding="utf-8")
    logger.info("STS data ready in %s", target)
    return target
