"""Parquet / Arrow input and output of the sharded encoder, and the map step for Ray Data / Spark (issue 17 item 4).
Reading a table by row range: tests/io/test_arrow.py (whose table helpers these tests use).

Row ``i`` of a store made from a table is row ``i`` of its text column, so a table input gives the store a text file
of the same sentences gives, bit for bit, in every shard format.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from bertflow.cli import app  # noqa: E402
from bertflow.errors import InputError, ModelFileError  # noqa: E402
from bertflow.integrations.map_step import MapEncoder  # noqa: E402
from bertflow.scale.encode import encode_file_to_store  # noqa: E402
from bertflow.scale.layout import read_manifest  # noqa: E402
from bertflow.scale.reader import open_embeddings  # noqa: E402

from ..io.test_arrow import ROWS, _table, write_table  # noqa: E402
from .conftest import make_lines, one_thread, reference  # noqa: E402

ENCODE = dict(shard_size=32, chunk_size=16, batch_size=8)


@pytest.fixture()
def lines() -> list[str]:
    return make_lines(ROWS, seed=3)


@pytest.fixture()
def expected(tiny_encoder, lines) -> np.ndarray:
    return reference(tiny_encoder, lines, batch_size=8, chunk_size=16)


def shard_tables(folder: Path, suffix: str) -> pa.Table:
    files = sorted((folder / "shards").glob(f"*{suffix}"))
    read = pq.read_table if suffix == ".parquet" else feather.read_table
    return pa.concat_tables([read(f) for f in files])


# -- stores from tables, stores of tables ----------------------------------------------------------------------------


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


def test_a_text_file_can_be_stored_as_parquet_shards(tiny_encoder, corpus_file, tmp_path):
    path, text_lines = corpus_file
    with one_thread():
        encode_file_to_store(path, tmp_path / "out", tiny_encoder, shard_format="parquet", merge=True, **ENCODE)
    want = reference(tiny_encoder, text_lines, batch_size=8, chunk_size=16)
    np.testing.assert_array_equal(np.asarray(open_embeddings(tmp_path / "out")), want)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "embeddings.npy"), want)
    assert read_manifest(tmp_path / "out")["input"]["lines"] == 203


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
    from bertflow.io.arrow import read_embedding_table

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


def test_cli_reads_a_table_and_refuses_bad_columns_and_folders(tiny_model_dir, tmp_path, lines):
    path = write_table(tmp_path / "in.arrow", _table(lines))
    runner = CliRunner()
    base = ["distributed-encode", str(path), "--model", str(tiny_model_dir), "--device", "cpu", "-q"]
    sizes = ["--shard-size", "32", "--chunk-size", "16", "--batch-size", "8"]
    out = tmp_path / "emb"
    with one_thread():
        r = runner.invoke(app, [*base, "-o", str(out), *sizes, "--format", "parquet", "--id-column", "doc_id"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["rows"] == ROWS
    assert shard_tables(out, ".parquet").column("doc_id").to_pylist()[:2] == [1000, 1001]
    assert open_embeddings(out).shape[0] == ROWS
    for extra, message in [
        (["--text-column", "body"], "has no column 'body'; its columns: doc_id, text"),
        (["--text-column", "doc_id"], "column 'doc_id' has type int64, not text"),
        (["--id-column", "doc_id"], "--id-column needs table shards"),
    ]:
        r = runner.invoke(app, [*base, "-o", str(tmp_path / "new"), *sizes, *extra])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and message in r.output, r.output
        assert not (tmp_path / "new").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.tex").write_text("precious")
    r = runner.invoke(app, [*base, "-o", str(busy), *sizes, "--format", "arrow"])
    assert r.exit_code == 2 and "not empty" in r.output
    assert sorted(p.name for p in busy.iterdir()) == ["thesis.tex"]
    r = runner.invoke(app, [*base, "-o", str(out), *sizes, "--format", "arrow", "--id-column", "doc_id"])
    assert r.exit_code == 2 and "shard_format" in r.output  # resuming in another format is refused


# -- the map step for Ray Data / Spark, run by a process pool ---------------------------------------------------------

_worker: MapEncoder | None = None
