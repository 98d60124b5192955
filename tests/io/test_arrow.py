"""Parquet / Arrow tables (bertflow.io.arrow): reading a text column by row range (only the rows asked for; bad
columns, nulls, blank rows and non-tables as one-line errors), and stores made from tables or of table shards: row
``i`` of a store made from a table is row ``i`` of its text column, bit for bit what a text file of the same
sentences gives, in every shard format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bertflow.errors import InputError, ModelFileError  # noqa: E402
from bertflow.io.arrow import TableColumn, open_input, read_embedding_table  # noqa: E402
from bertflow.scale.encode import encode_file_to_store  # noqa: E402
from bertflow.scale.layout import read_manifest  # noqa: E402
from bertflow.scale.reader import open_embeddings  # noqa: E402

from ..scale.conftest import make_lines, one_thread, reference  # noqa: E402

ROWS = 101
ENCODE = dict(shard_size=32, chunk_size=16, batch_size=8)


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


@pytest.fixture()
def expected(tiny_encoder, lines) -> np.ndarray:
    return reference(tiny_encoder, lines, batch_size=8, chunk_size=16)


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


# -- stores from tables, stores of tables ----------------------------------------------------------------------------


def shard_tables(folder: Path, suffix: str) -> pa.Table:
    files = sorted((folder / "shards").glob(f"*{suffix}"))
    read = pq.read_table if suffix == ".parquet" else feather.read_table
    return pa.concat_tables([read(f) for f in files])


@pytest.mark.parametrize("shard_format", ["npy", "parquet", "arrow"])
@pytest.mark.parametrize("name", ["in.parquet", "in.feather"])
def test_a_table_input_gives_the_text_store_in_every_format(
    tiny_encoder, tmp_path, lines, expected, name, shard_format
):
    path = write_table(tmp_path / name, _table(lines), group=30)  # row groups cross shard boundaries
    out = tmp_path / "out"
    id_column = None if shard_format == "npy" else "doc_id"
    with one_thread():
        summary = encode_file_to_store(
            path, out, tiny_encoder, shard_format=shard_format, id_column=id_column, **ENCODE
        )
    assert summary["rows"] == ROWS and summary["shards"] == 4
    store = open_embeddings(out, verify=True)
    np.testing.assert_array_equal(np.asarray(store), expected)
    np.testing.assert_array_equal(store[[100, 3, 64, 31]], expected[[100, 3, 64, 31]])
    manifest = read_manifest(out)
    assert manifest["input"]["column"] == "text" and manifest["input"]["rows"] == ROWS
    assert manifest["format_version"] == (1 if shard_format == "npy" else 2)
    assert manifest.get("shard_format") == (None if shard_format == "npy" else shard_format)
    if shard_format != "npy":
        table = shard_tables(out, f".{shard_format}")
        assert table.schema.field("embedding").type == pa.list_(pa.float32(), expected.shape[1])
        assert table.column("row").to_pylist() == list(range(ROWS))
        assert table.column("doc_id").to_pylist() == [1000 + i for i in range(ROWS)]
        np.testing.assert_array_equal(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)), expected)


@pytest.mark.parametrize("shard_format", ["parquet", "arrow"])
def test_resume_after_a_killed_table_shard(tiny_encoder, tmp_path, lines, expected, shard_format):
    path = write_table(tmp_path / "in.parquet", _table(lines))
    out = tmp_path / "out"
    options = dict(shard_format=shard_format, id_column="doc_id", **ENCODE)
    with one_thread():
        encode_file_to_store(path, out, tiny_encoder, **options)
        shards = out / "shards"
        (shards / f"part-000001.{shard_format}").unlink()  # lost shard
        (shards / "part-000002.json").unlink()  # shard renamed, record never written
        (shards / f".part-000003.{shard_format}.tmp-host-1").write_bytes(b"PAR1 half a shard")  # a killed writer
        summary = encode_file_to_store(path, out, tiny_encoder, **options)
    assert (summary["encoded_shards"], summary["skipped_shards"]) == (2, 2)
    assert not [p for p in shards.iterdir() if ".tmp-" in p.name]
    np.testing.assert_array_equal(np.asarray(open_embeddings(out, verify=True)), expected)
    # A shard whose bytes changed after its record was written is caught by verify, as for .npy shards.
    target = shards / f"part-000000.{shard_format}"
    data = bytearray(target.read_bytes())
    at = data.find(expected[5].tobytes())  # row 5's floats (uncompressed in Arrow; stored raw by snappy in Parquet)
    assert at > 0
    data[at + 1] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="does not match its recorded sha256"):
        open_embeddings(out, verify=True)


def test_a_blank_row_stops_the_run_at_its_shard_and_keeps_the_shards_before(tiny_encoder, tmp_path, lines, expected):
    rows = list(lines)
    rows[70] = " \t "
    path = write_table(tmp_path / "in.feather", _table(rows))
    out = tmp_path / "out"
    with one_thread(), pytest.raises(InputError, match=r"row 70 \(counting from 0\) of column 'text' is empty"):
        encode_file_to_store(path, out, tiny_encoder, shard_format="arrow", **ENCODE)
    # Shards 0 and 1 (rows 0..63) were finished before shard 2 (rows 64..95) was read; nothing half-written remains.
    assert sorted(p.name for p in (out / "shards").iterdir()) == [
        "part-000000.arrow",
        "part-000000.json",
        "part-000001.arrow",
        "part-000001.json",
    ]
    for k in (0, 1):
        got = read_embedding_table(out / "shards" / f"part-00000{k}.arrow", "arrow", expected.shape[1], 32 * k)
        np.testing.assert_array_equal(got, expected[32 * k : 32 * (k + 1)])


def test_resume_refuses_another_format_column_or_id(tiny_encoder, tmp_path, lines):
    path = write_table(tmp_path / "in.parquet", pa.table({"text": lines, "title": lines[::-1], "k": range(ROWS)}))
    out = tmp_path / "out"
    with one_thread():
        encode_file_to_store(path, out, tiny_encoder, shard_format="parquet", **ENCODE)
    before = sorted(p.name for p in (out / "shards").iterdir())
    with pytest.raises(InputError, match=r"\(shard_format, shards differ\)"):
        encode_file_to_store(path, out, tiny_encoder, shard_format="arrow", **ENCODE)
    with pytest.raises(InputError, match=r"\(shard_format, shards differ\)"):
        encode_file_to_store(path, out, tiny_encoder, **ENCODE)  # npy
    with pytest.raises(InputError, match=r"\(input differ\)"):
        encode_file_to_store(path, out, tiny_encoder, shard_format="parquet", text_column="title", **ENCODE)
    with pytest.raises(InputError, match=r"\(id_column differ\)"):
        encode_file_to_store(path, out, tiny_encoder, shard_format="parquet", id_column="k", **ENCODE)
    with pytest.raises(InputError, match="--id-column needs table shards"):
        encode_file_to_store(path, tmp_path / "n", tiny_encoder, id_column="k", **ENCODE)
    assert sorted(p.name for p in (out / "shards").iterdir()) == before
    with one_thread():
        summary = encode_file_to_store(path, out, tiny_encoder, shard_format="arrow", overwrite=True, **ENCODE)
    assert summary["skipped_shards"] == 0 and read_manifest(out)["shard_format"] == "arrow"
