"""Parquet and Arrow IPC files: a text column read by row range, and embedding tables written in a stream.

Input. :class:`TableColumn` reads one string column of a Parquet file (by row group) or an Arrow IPC / Feather v2
file (by record batch, memory-mapped), only the groups that overlap the rows asked for. Row ``i`` of a store is row
``i`` of the table, so a null or blank row is an :class:`~bertflow.errors.InputError` naming it, not skipped: nulls
when the input is indexed, blank strings when their shard is read (as blank lines of a text file).

Output. :class:`EmbeddingTableWriter` streams an embedding table (``row`` int64, an optional id column copied from
the input, ``embedding`` fixed_size_list<float32>[D]), hashing the bytes as they go: the shards of ``--format
parquet|arrow`` stores, and ``bertflow encode``'s ``.parquet`` / ``.arrow`` output (:func:`write_embedding_file`).

pyarrow is imported when first needed (``pip install 'bertflow[arrow]'``).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import InputError, ModelFileError
from ..validation import is_blank
from .formats import sha256_file
from .text import InputIndex, TextLines

#: Table formats read (``--input-format``), and the file name suffixes read as each.
TABLE_FORMATS = ("parquet", "arrow")
TABLE_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
#: The text column of a table input when none is named (``--text-column``).
DEFAULT_TEXT_COLUMN = "text"
#: Column names of an embedding table.
ROW_COLUMN, EMBEDDING_COLUMN = "row", "embedding"


def pyarrow() -> Any:
    """The pyarrow module, or a one-line InputError saying how to install it."""
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401 - loads the submodules used below
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise InputError("Parquet and Arrow files need pyarrow: pip install 'bertflow[arrow]'") from None
    return pa


def input_format(path: str | Path, explicit: str | None = None) -> str:
    """``"text"``, ``"parquet"`` or ``"arrow"``: ``explicit`` if given, else from the suffix (text otherwise)."""
    if explicit is not None:
        if explicit not in ("text", *TABLE_FORMATS):
            raise InputError(f"input format must be text, parquet or arrow, got {explicit!r}")
        return explicit
    return TABLE_SUFFIXES.get(Path(path).suffix.lower(), "text")


@dataclass
class TableColumn:
    """The string ``column`` of a Parquet or Arrow IPC (``kind``) file, read by row range, with an ``id_column``
    (any type) to copy beside the embeddings. Nothing is read before the first call."""

    path: Path
    column: str
    kind: str
    id_column: str | None = None
    _file: Any = field(default=None, init=False, repr=False)
    _starts: list[int] = field(default_factory=list, init=False, repr=False)  # first row of each group, then N

    def _open(self) -> Any:
        if self._file is not None:
            return self._file
        pa = pyarrow()
        try:
            self._file = _open_table(self.path, self.kind)
            if self.kind == "parquet":
                counts = [self._file.metadata.row_group(i).num_rows for i in range(self._file.num_row_groups)]
            else:
                counts = [self._file.get_batch(i).num_rows for i in range(self._file.num_record_batches)]
        except (pa.ArrowInvalid, OSError) as e:
            arrow = "an Arrow IPC file (the random-access format; Feather v2)"
            what = "a Parquet file" if self.kind == "parquet" else arrow
            raise InputError(f"cannot read {self.path} as {what}: {str(e).splitlines()[0]}") from None
        self._starts = [0, *np.cumsum(counts, dtype=np.int64).tolist()]
        schema = _schema(self._file)
        names = list(schema.names)
        for name in filter(None, (self.column, self.id_column)):
            if name not in names:
                raise InputError(f"{self.path} has no column {name!r}; its columns: {', '.join(names) or '(none)'}")
        kind = schema.field(self.column).type
        value = kind.value_type if pa.types.is_dictionary(kind) else kind
        if not (pa.types.is_string(value) or pa.types.is_large_string(value) or pa.types.is_string_view(value)):
            raise InputError(
                f"{self.path}: column {self.column!r} has type {kind}, not text (string); name the text column "
                "with --text-column"
            )
        if self.id_column in (ROW_COLUMN, EMBEDDING_COLUMN):
            raise InputError(f"the id column may not be called {self.id_column!r}: the output table has one already")
        return self._file

    @property
    def rows(self) -> int:
        self._open()
        return self._starts[-1]

    def check(self) -> int:
        """Check the columns and that the text column has no nulls (InputError naming the problem); return the row
        count."""
        self._open()
        self._check_no_nulls()
        return self.rows

    def id_field(self) -> Any:
        """The ``pyarrow.Field`` of the id column (copied into an output table)."""
        if self.id_column is None:
            raise ValueError("no id column was given")
        return _schema(self._open()).field(self.id_column)

    def index(self, every: int) -> InputIndex:
        """:meth:`check`, and hash the file."""
        self.check()
        record = {
            "format": self.kind,
            "column": self.column,
            "bytes": self.path.stat().st_size,
            "sha256": sha256_file(self.path),
            "rows": self.rows,
        }
        return InputIndex(self.rows, None, record)

    def _check_no_nulls(self) -> None:
        # Nulls are refused, not skipped: row i of the store must stay row i of the table. Parquet keeps null
        # counts in its metadata, an Arrow batch its own: the strings are decoded only where a count is missing.
        file, total, first = self._file, 0, None
        for g in range(len(self._starts) - 1):
            if self.kind == "parquet":
                meta = file.metadata.row_group(g).column(file.schema_arrow.get_field_index(self.column))
                stats = meta.statistics
                if stats is not None and stats.has_null_count and (stats.null_count == 0 or first is not None):
                    total += stats.null_count
                    continue
                values = file.read_row_group(g, columns=[self.column]).column(0)
            else:
                values = file.get_batch(g).column(self.column)
            if values.null_count:
                total += values.null_count
                if first is None:
                    first = self._starts[g] + values.is_null().to_pylist().index(True)
        if total:
            raise InputError(
                f"{self.path}: column {self.column!r} holds {total} null value(s), the first at row {first} (counting "
                "from 0); every row becomes one embedding row, so drop or fill the nulls first"
            )

    def _iter_column(self, name: str, start: int, stop: int) -> Iterator[Any]:
        """The arrays of column ``name`` covering rows ``[start, stop)``, in order (only overlapping groups read)."""
        file = self._open()
        first = bisect.bisect_right(self._starts, start) - 1
        row = self._starts[first]
        for g in range(first, len(self._starts) - 1):
            if row >= stop:
                return
            if self.kind == "parquet":
                batches = (b.column(0) for b in file.iter_batches(batch_size=65536, row_groups=[g], columns=[name]))
            else:
                batches = iter([file.get_batch(g).column(name)])
            for values in batches:
                lo, hi = max(start - row, 0), min(stop - row, len(values))
                if hi > lo:
                    yield values.slice(lo, hi - lo)
                row += len(values)
                if row >= stop:
                    return

    def read(self, start: int, stop: int, offset: int = 0) -> list[str]:
        """The sentences of rows ``[start, stop)`` (``offset`` unused); InputError at a null or blank row (named,
        counting from 0) or too few rows (the file changed since it was indexed)."""
        out: list[str] = []
        for values in self._iter_column(self.column, start, stop):
            texts = values.to_pylist()
            for i, text in enumerate(texts):
                if text is None or is_blank(text):
                    what = "null" if text is None else "empty or only whitespace or invisible characters"
                    raise InputError(
                        f"{self.path}: row {start + len(out) + i} (counting from 0) of column {self.column!r} is "
                        f"{what}; every row becomes one embedding row, so remove such rows first"
                    )
            out += texts
        if len(out) != stop - start:
            raise InputError(f"{self.path} has fewer rows than when it was indexed: the file changed")
        return out

    def read_ids(self, start: int, stop: int) -> Any:
        """The id column's values of rows ``[start, stop)`` as one pyarrow array (its own type kept)."""
        kind = self.id_field().type  # ValueError without an id column
        chunks = list(self._iter_column(self.id_column, start, stop))
        return pyarrow().concat_arrays(chunks) if chunks else pyarrow().array([], type=kind)


#: What a sharded run reads: a text file or a table's text column (``index(every)``, ``read(start, stop, offset)``).
InputSource = TextLines | TableColumn


def open_input(
    path: str | Path,
    *,
    text_column: str | None = None,
    input_format_name: str | None = None,
    id_column: str | None = None,
    encoding_errors: str = "strict",
) -> InputSource:
    """The input of ``distributed-encode``: a :class:`TableColumn` for Parquet/Arrow (format from
    ``input_format_name`` or the suffix), else a :class:`TextLines`."""
    kind = input_format(path, input_format_name)
    if kind == "text":
        for option, value in (("--text-column", text_column), ("--id-column", id_column)):
            if value is not None:
                raise InputError(
                    f"{option} applies to Parquet or Arrow input; {path} is read as a text file (one sentence per "
                    "line; pass --input-format parquet or arrow if it is a table)"
                )
        return TextLines(Path(path), encoding_errors)
    return TableColumn(Path(path), text_column or DEFAULT_TEXT_COLUMN, kind, id_column)


def iter_table_sentences(source: TableColumn, block_rows: int = 65536) -> Iterator[str]:
    """The sentences of every row of ``source`` in order, read ``block_rows`` at a time."""
    n = source.rows
    for start in range(0, n, block_rows):
        yield from source.read(start, min(n, start + block_rows))


class _HashingFile:
    """A write-only file for pyarrow that hashes every byte on its way to ``fh`` (so no second read is needed)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.sha256 = fh, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self.fh.write(data)

    def tell(self) -> int:
        return self.fh.tell()

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:  # the owner of fh closes it (atomic_file renames it afterwards)
        pass

    @property
    def closed(self) -> bool:
        return self.fh.closed

    def writable(self) -> bool:
        return True


class EmbeddingTableWriter:
    """Write an embedding table of width ``dim`` (with ``id_field``, a ``pyarrow.Field``, if any) to the open file
    ``fh`` (not closed), one Parquet row group or Arrow IPC record batch per block."""

    def __init__(self, fh: IO[bytes], kind: str, dim: int, id_field: Any = None) -> None:
        pa = pyarrow()
        self._pa, self.dim = pa, int(dim)
        row = pa.field(ROW_COLUMN, pa.int64(), nullable=False)
        embedding = pa.field(EMBEDDING_COLUMN, pa.list_(pa.float32(), self.dim), nullable=False)
        self.schema = pa.schema([row, id_field, embedding] if id_field is not None else [row, embedding])
        self._sink = _HashingFile(fh)
        if kind == "parquet":
            # Floats do not repeat: dictionary encoding would only cost time.
            self._writer = pa.parquet.ParquetWriter(self._sink, self.schema, use_dictionary=False)
        else:
            self._writer = pa.ipc.new_file(self._sink, self.schema)

    def write(self, first_row: int, block: np.ndarray, ids: Any = None) -> None:
        """Append rows ``first_row ...`` of float32 ``block`` [n, D], with their ids (a pyarrow array) if any."""
        pa = self._pa
        n = len(block)
        columns = [pa.array(np.arange(first_row, first_row + n, dtype=np.int64))]
        if ids is not None:
            columns.append(ids)
        flat = pa.array(np.ascontiguousarray(block, dtype=np.float32).reshape(-1))
        columns.append(pa.FixedSizeListArray.from_arrays(flat, self.dim))
        self._writer.write_batch(pa.record_batch(columns, schema=self.schema))

    def close(self) -> str:
        """Write the footer; return the sha256 of everything written."""
        self._writer.close()
        self._sink.flush()
        return self._sink.sha256.hexdigest()


def _open_table(path: Path, kind: str) -> Any:
    pa = pyarrow()
    if kind == "parquet":
        return pa.parquet.ParquetFile(path)
    return pa.ipc.open_file(pa.memory_map(str(path), "r"))


def _schema(file: Any) -> Any:
    """The Arrow schema of an open Parquet file or Arrow IPC reader."""
    return file.schema_arrow if hasattr(file, "schema_arrow") else file.schema


def embedding_table_rows(path: str | Path, kind: str, dim: int) -> int | None:
    """Rows of the embedding table at ``path`` from its metadata, or None if it is unreadable or has another
    schema."""
    pa = pyarrow()
    try:
        table = _open_table(Path(path), kind)
        if _schema(table).field(EMBEDDING_COLUMN).type != pa.list_(pa.float32(), int(dim)):
            return None
        if kind == "parquet":
            return int(table.metadata.num_rows)
        return sum(table.get_batch(i).num_rows for i in range(table.num_record_batches))
    except (pa.ArrowException, OSError, KeyError):
        return None


def read_embedding_table(path: str | Path, kind: str, dim: int, first_row: int) -> np.ndarray:
    """The float32 ``[rows, D]`` embeddings of a table written by :class:`EmbeddingTableWriter`; ModelFileError if
    unreadable or its ``row`` column does not count up from ``first_row``."""
    pa = pyarrow()
    try:
        file = _open_table(Path(path), kind)
        columns = [ROW_COLUMN, EMBEDDING_COLUMN]
        table = file.read(columns=columns) if kind == "parquet" else file.read_all().select(columns)
    except (pa.ArrowException, OSError) as e:
        raise ModelFileError(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    rows = table.column(ROW_COLUMN).to_numpy()
    if not np.array_equal(rows, np.arange(first_row, first_row + len(rows))):
        raise ModelFileError(f"{path} does not hold rows {first_row}..{first_row + len(rows) - 1} in order")
    parts = [c.flatten().to_numpy(zero_copy_only=False) for c in table.column(EMBEDDING_COLUMN).chunks]
    flat = np.concatenate(parts) if len(parts) != 1 else parts[0]
    return np.asarray(flat, dtype=np.float32).reshape(len(rows), int(dim))


def write_embedding_file(
    path: str | Path,
    kind: str,
    dim: int,
    blocks: Iterable[np.ndarray],
    *,
    ids: Callable[[int, int], Any] | None = None,
    id_field: Any = None,
) -> int:
    """Write float32 ``blocks`` ([n, D] each, in row order) as one ``kind`` embedding table at ``path``, streamed
    and atomic; returns the rows. ``ids(start, stop)`` gives the id column's values (:meth:`TableColumn.read_ids`)."""
    from .files import atomic_file

    rows = 0
    with atomic_file(path, "wb") as fh:
        writer = EmbeddingTableWriter(fh, kind, dim, id_field)
        for block in blocks:
            writer.write(rows, block, None if ids is None else ids(rows, rows + len(block)))
            rows += len(block)
        writer.close()
    return rows
