"""Reading user text files: sentences, TSV columns and sentence pairs, streamed line by line, and reads by byte
offset for sharded work.

They decode UTF-8 line by line, strip only the line terminator (``"\\n"`` or ``"\\r\\n"``; a lone ``"\\r"`` is
refused) and never touch the rest of a line: leading and trailing spaces and ``"`` are part of a sentence. Every
problem with a file's content is an :class:`~bertflow.errors.InputError` naming the file and the 1-based line number.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import itertools
import logging
import math
import os
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np

from bertflow.errors import InputError
from bertflow.validation import INVISIBLE, is_blank

logger = logging.getLogger(__name__)


EncodingErrors = Literal["strict", "replace"]
"""How undecodable bytes are handled: ``"strict"`` raises InputError, ``"replace"`` substitutes U+FFFD."""

BOM = "\ufeff"

_GZIP_MAGIC = b"\x1f\x8b"


def _open_binary(path: str | Path) -> io.BufferedIOBase:
    """Open ``path`` for binary reading (OS errors as InputError naming it); gzip (by its magic bytes) is
    decompressed. ``"-"`` is standard input as it comes, through a duplicate descriptor (closing it keeps stdin)."""
    p = Path(path)
    if str(path) == "-":
        return open(os.dup(sys.stdin.fileno()), "rb")  # noqa: SIM115 - the caller closes it
    try:
        fh = open(p, "rb")  # noqa: SIM115 - the caller closes it
        if fh.peek(2)[:2] != _GZIP_MAGIC:
            return fh
        fh.close()  # reopened by name, so that the GzipFile owns (and closes) its file
        return gzip.open(p, "rb")
    except FileNotFoundError:
        raise InputError(f"cannot read {p}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"cannot read {p}: it is a directory, expected a text file") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None


def _looks_utf16(raw: bytes) -> bool:
    """Whether a line's bytes look like UTF-16 read as UTF-8: at least a third NUL, nearly all at even or nearly all
    at odd positions (Latin text in UTF-16 has a NUL beside every character; NULs in real UTF-8 are rare)."""
    if len(raw) < 2:
        return False
    even, odd = raw[0::2].count(0), raw[1::2].count(0)
    nuls = even + odd
    return 3 * nuls >= len(raw) and 10 * max(even, odd) >= 9 * nuls and nuls < len(raw)


def check_not_utf16(raw: bytes, path: Path, number: int) -> None:
    """Raise :class:`InputError` naming ``path`` and line ``number`` if the line's bytes look like UTF-16."""
    if b"\x00" in raw and _looks_utf16(raw):
        # Byte order: the BOM, else where ASCII's NULs are; known for line 1 only (later lines start mid-character).
        bom = {b"\xff\xfe": "UTF-16LE", b"\xfe\xff": "UTF-16BE"}.get(raw[:2]) if number == 1 else None
        guess = "UTF-16LE" if raw[1::2].count(0) >= raw[0::2].count(0) else "UTF-16BE"
        order = bom or (guess if number == 1 else "UTF-16")
        mark = " with a byte-order mark" if bom else " without a byte-order mark" if number == 1 else ""
        source = "UTF-16" if bom or number != 1 else order
        raise InputError(
            f"{path}: line {number} has a NUL byte every other byte: the file is {order}{mark}, not UTF-8; "
            f"re-encode it as UTF-8 (e.g. iconv -f {source} -t UTF-8)"
        )


def iter_lines(path: str | Path, errors: EncodingErrors = "strict") -> Iterator[tuple[int, str]]:
    """Stream ``(1-based line number, text)`` of a UTF-8 text file, plain or gzip-compressed, split on ``b"\\n"``
    only (U+2028 or form feeds never split a line), each line as :func:`decode_line` gives it."""
    if errors not in ("strict", "replace"):
        raise InputError(f"errors must be 'strict' or 'replace', got {errors!r}")
    p = Path(path)
    with _open_binary(p) as fh:
        try:
            for number, raw in enumerate(fh, start=1):
                yield number, decode_line(raw, p, number, errors, first=number == 1)
        except (OSError, EOFError, zlib.error) as exc:  # a read error or bad gzip data
            what = "corrupt or truncated gzip data" if isinstance(fh, gzip.GzipFile) else "read error"
            raise InputError(f"cannot read {p}: {what} ({exc})") from None


def decode_line(raw: bytes, path: Path, number: int, errors: str, *, first: bool) -> str:
    """One raw line as text, the one decoding rule of every reader here: terminator (``\\n``, ``\\r\\n``, or a lone
    ``\\r`` ending the file) removed, UTF-16 and a carriage return inside the line refused (CR-only line ends would
    read as one sentence), UTF-8 decoded (``errors`` as in :func:`iter_lines`), a BOM dropped from the ``first``
    line. Raises InputError naming the file, the 1-based line ``number``, the byte column and the byte."""
    raw = raw.removesuffix(b"\n").removesuffix(b"\r")  # "\r" alone: the last line of a file ending in a lone CR
    check_not_utf16(raw, path, number)
    if b"\r" in raw:
        column = raw.index(b"\r") + 1
        raise InputError(
            f"{path}: line {number} holds a carriage return (\\r, byte column {column}) that ends no line: the file "
            "has CR-only (old Mac) line ends or a stray CR, and bertflow splits lines on \\n and \\r\\n only; "
            "convert it first (e.g. tr '\\r' '\\n' < IN > OUT, or remove stray CRs)"
        )
    try:
        text = raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1]
        raise InputError(
            f"{path}: line {number} is not valid UTF-8 (byte 0x{bad.hex()} at byte column "
            f"{exc.start + 1}: {exc.reason}). Re-encode the file as UTF-8, or pass "
            f"errors='replace' (CLI: --encoding-errors replace) to read undecodable bytes as U+FFFD."
        ) from None
    return text[1:] if first and text.startswith(BOM) else text


def read_sentences(
    path: str | Path,
    *,
    errors: EncodingErrors = "strict",
    skip_blank: bool = True,
    unique: bool = False,
) -> list[str]:
    """The sentences of a file with one per line (:func:`iter_lines`), in file order, kept as written; blank lines
    (:func:`bertflow.validation.is_blank`) skipped and counted at INFO (``skip_blank=False``: InputError naming
    it), repeats dropped with ``unique``. InputError for an unreadable file or no sentences."""
    p = Path(path)
    sentences: list[str] = []
    n_blank = 0
    for number, text in iter_lines(p, errors=errors):
        if not is_blank(text):
            sentences.append(text)
        elif skip_blank:
            n_blank += 1
        else:
            raise InputError(
                f"{p}: line {number} is empty or only whitespace or invisible characters (zero-width, U+FEFF, "
                "NUL); remove it or allow skipping blank lines"
            )
    if n_blank:
        logger.info("%s: skipped %d blank line(s)", p, n_blank)
    if unique and len(kept := distinct(sentences)) < len(sentences):
        logger.info("%s: dropped %d duplicate sentence(s)", p, len(sentences) - len(kept))
        sentences = kept
    if not sentences:
        detail = f" ({n_blank} blank line(s) skipped)" if n_blank else ""
        raise InputError(f"no sentences in {p}{detail}")
    return sentences


def _iter_tsv_rows(path: Path, errors: EncodingErrors) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` of every non-empty line, split on TAB only (no quoting)."""
    n_empty = 0
    for number, text in iter_lines(path, errors=errors):
        if text == "":  # a stray empty line (typically a second trailing newline) carries no row
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
    refuse_blank: bool = False,
) -> list[str]:
    """The values of ``column`` (a header name, or a 0-based index) of a TAB-separated file, one per data row.
    Split on TAB only (no quoting, no stripping); empty lines skipped. InputError naming the line or the header."""
    p = Path(path)
    rows = _iter_tsv_rows(p, errors)
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
        if refuse_blank and is_blank(fields[index]):
            raise InputError(
                f"{p}: line {number}, column {label} is empty (or only whitespace or invisible characters); "
                "fill it in or remove the row"
            )
        values.append(fields[index])
    if not values:
        raise InputError(f"no data rows in {p}")
    return values


@dataclass
class SentencePairs:
    """N aligned sentence pairs, optionally with a gold score (STS) or a label (NLI) per pair: ``scores``, float64
    ``(N,)`` on the data set's own scale (0-5 STS, 1-5 SICK); ``labels`` (e.g. ``"entailment"``); ``columns``, every
    column of the file by header name as raw text (``read_pairs(..., keep_columns=True)``)."""

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
        """Every sentence: ``s1, s2`` of pair 0, then of pair 1, ..."""
        for pair in zip(self.sentences1, self.sentences2, strict=True):
            yield from pair


def read_pairs(
    path: str | Path, *, errors: EncodingErrors = "strict", require_target: bool = True, keep_columns: bool = False
) -> SentencePairs:
    """Read a pair TSV with header ``score|label<TAB>sentence1<TAB>sentence2`` (the STS data format; other columns
    allowed). Every row has exactly as many fields as the header (a TAB inside a sentence would shift columns).
    InputError, with the line number: a bad header, row, score or sentence; or no rows.
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
    i1, i2, it = header.index("sentence1"), header.index("sentence2"), header.index(target) if target else -1
    table: list[list[str]] = []
    scores: list[float] = []
    for number, fields in rows:
        if len(fields) != len(header):
            raise InputError(
                f"{p}: line {number} has {len(fields)} TAB-separated field(s), expected {len(header)} "
                f"({', '.join(header)})"
            )
        if is_blank(fields[i1]) or is_blank(fields[i2]):
            which = "sentence1" if is_blank(fields[i1]) else "sentence2"
            raise InputError(f"{p}: line {number}: {which} is empty (or only whitespace or invisible characters)")
        if target == "score":
            t = fields[it]
            try:
                value = float(t)
            except ValueError:
                raise InputError(f"{p}: line {number}: score {t!r} is not a number") from None
            if not math.isfinite(value):
                raise InputError(f"{p}: line {number}: score {t!r} is not finite")
            scores.append(value)
        table.append(fields)
    if not table:
        raise InputError(f"no sentence pairs in {p}")
    s1, s2 = [row[i1] for row in table], [row[i2] for row in table]
    kept = {name: [row[i] for row in table] for i, name in enumerate(header)} if keep_columns else None
    labels = [row[it] for row in table] if target == "label" else None
    return SentencePairs(s1, s2, np.asarray(scores) if target == "score" else None, labels, columns=kept)


def distinct(sentences: Iterable[str]) -> list[str]:
    """Distinct strings in order of first occurrence."""
    return list(dict.fromkeys(sentences))


@dataclass(frozen=True)
class InputIndex:
    """What indexing the input of a sharded run learns: ``rows``; ``offsets``, the byte offset of every shard's first
    line (text files; None for tables, read by row number); ``record``, the input's identity in the manifest (size,
    sha256, a table's column) that a resumed run must repeat."""

    rows: int
    offsets: tuple[int, ...] | None
    record: dict[str, Any]


def index_lines(path: str | Path, every: int, *, block_size: int = 1 << 24) -> InputIndex:
    """One pass over a text file, streamed in blocks of ``block_size`` bytes: its line count (a last line without a
    newline counts), the byte offset of line ``k * every`` for every ``k * every < lines`` (``every``: the shard
    size), its size and sha256. Lines split on ``b"\\n"`` as :func:`iter_lines` does (row ``i`` is line ``i + 1``)."""
    if every < 1:
        raise InputError(f"every must be positive, got {every}")
    p = Path(path)
    h = hashlib.sha256()
    offsets = [0]
    newlines = 0  # newlines seen before the current block
    position = 0  # bytes before the current block
    last = b""
    try:
        with open(p, "rb") as fh:
            while block := fh.read(block_size):
                h.update(block)
                count = block.count(b"\n")
                # Shard k starts right after the (k * every)-th newline.
                target = len(offsets) * every
                if newlines + count >= target:
                    where = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                    while newlines + count >= target:
                        offsets.append(position + int(where[target - newlines - 1]) + 1)
                        target += every
                newlines += count
                position += len(block)
                last = block[-1:]
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from None
    lines = newlines + (1 if position and last != b"\n" else 0)
    n_shards = -(-lines // every)
    return InputIndex(lines, tuple(offsets[:n_shards]), {"bytes": position, "sha256": h.hexdigest(), "lines": lines})


@dataclass(frozen=True)
class TextLines:
    """A text file as the input of a sharded run, read by byte offset."""

    path: Path
    errors: str = "strict"

    def index(self, every: int) -> InputIndex:
        return index_lines(self.path, every)

    def read(self, start: int, stop: int, offset: int = 0) -> list[str]:
        """Lines ``start + 1 .. stop`` (rows ``[start, stop)``), the first beginning at byte ``offset``."""
        return read_lines(self.path, offset, stop - start, first_line=start + 1, errors=self.errors)


def read_lines(path: str | Path, offset: int, count: int, *, first_line: int = 1, errors: str = "strict") -> list[str]:
    """``count`` lines from byte ``offset`` (:func:`index_lines`), decoded and checked as :func:`decode_line` does;
    ``first_line`` (1-based) numbers them in errors. InputError: the file ended early, a bad or blank line.

    Decoded as one block (line by line took ~6 us a line on the thread that feeds the encoder); a block with a NUL,
    a lone CR or bytes that are not UTF-8 line by line, which gives the same text or names the bad line.
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            fh.seek(offset)
            raw = list(itertools.islice(fh, count))
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from None
    data = b"".join(raw)
    if b"\r" in data and data.count(b"\r") == data.count(b"\r\n"):
        data = data.replace(b"\r\n", b"\n")  # every CR ends a line: the terminator decode_line removes
    text = None
    if raw and len(raw) == count and b"\r" not in data and b"\x00" not in data:
        with contextlib.suppress(UnicodeDecodeError):
            text = data.removesuffix(b"\n").decode("utf-8")
    if text is None:
        lines = []
        for i, line in enumerate(raw):
            lines.append(decode_line(line, p, first_line + i, errors, first=i == 0 and offset == 0))
            if is_blank(lines[-1]):
                _blank_line_error(p, first_line + i)
        if len(lines) != count:
            raise InputError(
                f"{p} ended after line {first_line + len(lines) - 1}, but {count} lines were expected from line "
                f"{first_line}: the file changed since it was indexed"
            )
        return lines
    lines = (text[1:] if offset == 0 and text.startswith(BOM) else text).split("\n")
    # Blank lines (is_blank) are empty, all whitespace, or hold an invisible character: the two first checks run at C
    # speed over the list, and the rare block with an invisible character anywhere is checked line by line.
    if "" in lines or any(map(str.isspace, lines)) or any(c in text for c in INVISIBLE):
        for i, line in enumerate(lines):
            if is_blank(line):
                _blank_line_error(p, first_line + i)
    return lines


def _blank_line_error(path: Path, number: int) -> NoReturn:
    raise InputError(
        f"{path}: line {number} is empty or only whitespace or invisible characters; every line becomes one "
        "row, so remove blank lines first (e.g. grep -v '^[[:space:]]*$')"
    )
