"""Reading a text column of a Parquet / Arrow table by row range (bertflow.io.arrow): only the rows asked for, and bad
columns, nulls, blank rows and non-tables as one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bertflow.errors import InputError  # noqa: E402
from bertflow.io.arrow import TableColumn, open_input  # noqa: E402

from ..scale.conftest import make_lines  # noqa: E402

ROWS = 101


def _table(lines: list[str]) -> pa.Table:
    return pa.table({"doc_id": pa.array([1000 + i for i in range(len(lines))], pa.int64()), "text": lines})


def write_table(path: Path, table: pa.Table, group: int = 30) -> Path:
    """Parquet with row groups of ``group`` rows, or an Arrow IPC file (Feather v2) of record batches of ``group``."""
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=group)
    else:
        feather.write_feather(table, path, chunksize=group)
    return path


@pytest.fixture()
def lines() -> list[str]:
    return make_lines(ROWS, seed=3)


@pytest.mark.parametrize("name", ["in.parquet", "in.feather"])
def test_row_ranges_read_only_what_they_ask_for(tmp_path, lines, name):
    path = write_table(tmp_path / name, _table(lines), group=7)
    source = open_input(path, id_column="doc_id")
    assert isinstance(source, TableColumn) and source.rows == ROWS
    for start, stop in [(0, 7), (5, 9), (6, 50), (98, 101), (0, 101), (14, 15)]:
        assert source.read(start, stop) == lines[start:stop]
        assert source.read_ids(start, stop).to_pylist() == list(range(1000 + start, 1000 + stop))
    index = source.index(32)
    assert index.rows == ROWS and index.offsets is None
    assert index.record["column"] == "text" and index.record["format"] == ("parquet" if "parquet" in name else "arrow")


def test_bad_columns_and_rows_are_one_line_errors(tmp_path, lines):
    path = write_table(tmp_path / "in.parquet", _table(lines))
    with pytest.raises(InputError, match=r"has no column 'body'; its columns: doc_id, text"):
        open_input(path, text_column="body").index(32)
    with pytest.raises(InputError, match=r"column 'doc_id' has type int64, not text"):
        open_input(path, text_column="doc_id").index(32)
    with pytest.raises(InputError, match="--text-column applies to Parquet or Arrow input"):
        open_input(tmp_path / "in.txt", text_column="text")
    nulls = write_table(tmp_path / "nulls.feather", pa.table({"text": ["a b", None, "c", None]}), group=2)
    with pytest.raises(InputError, match=r"holds 2 null value\(s\), the first at row 1 \(counting from 0\)"):
        open_input(nulls).index(2)
    blank = write_table(tmp_path / "blank.parquet", pa.table({"text": ["fine", "also fine", " \u200b "]}), group=2)
    open_input(blank).index(2)  # blank strings are found when their rows are read, as blank lines are
    with pytest.raises(InputError, match=r"row 2 \(counting from 0\) of column 'text' is empty or only whitespace"):
        open_input(blank).read(2, 3)
    not_a_table = tmp_path / "text.parquet"
    not_a_table.write_text("one sentence\n", encoding="utf-8")
    with pytest.raises(InputError, match="cannot read .* as a Parquet file"):
        open_input(not_a_table).index(2)
