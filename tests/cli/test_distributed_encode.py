"""`bertflow distributed-encode` end to end: checks before any rank starts, one store per run."""

from __future__ import annotations

import json
import os
import socket

import pytest
from typer.testing import CliRunner

from bertflow.cli import app
from bertflow.io.files import folder_lock
from bertflow.scale.reader import open_embeddings

from ..conftest import SENTENCES, invoke, one_line_error
from ..safety import dead_pid, encode_store_args
from ..scale.conftest import make_lines, one_thread


def test_distributed_encode_refuses_a_weighted_raw_encoder_before_any_rank(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from bertflow.cli import app

    text = tmp_path / "in.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        app,
        [
            "distributed-encode",
            str(text),
            "-o",
            str(tmp_path / "store"),
            "-m",
            str(tiny_model_dir),
            "--pooling",
            "sif:mean",
        ],
    )
    assert result.exit_code == 2 and "needs token statistics" in result.output
    assert not (tmp_path / "store").exists()


def test_a_store_encoded_before_the_tokenizer_fingerprint_still_resumes(tiny_model_dir, corpus, tmp_path):
    import json

    from bertflow.scale.layout import MANIFEST_NAME

    store = tmp_path / "emb"
    args = ["distributed-encode", corpus, "-o", store, "--model", tiny_model_dir, "-q", "--chunk-size", "16"]
    args += ["--shard-size", "32"]
    assert invoke(*args).exit_code == 0
    manifest = json.loads((store / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert manifest["encoder"].pop("tokenizer_fingerprint").startswith("t1-")
    (store / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    r = invoke(*args)  # the earlier record lacks the key: resumed, not "encoder differs"
    assert r.exit_code == 0, r.stderr
    manifest["encoder"]["tokenizer_fingerprint"] = "t1-0000000000000000"
    (store / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    one_line_error(invoke(*args), "encoder")  # a recorded, different tokenizer is another encoder


def test_two_distributed_encode_runs_on_one_store(tiny_model_dir, corpus, tmp_path):
    store = tmp_path / "emb"
    store.mkdir()
    args = encode_store_args(corpus, store, tiny_model_dir)
    with folder_lock(store, "distributed-encode run"):  # another run, alive, holds the store
        one_line_error(invoke(*args), "in use", str(os.getpid()))
    (store / ".lock").write_text(f"{socket.gethostname()}-{dead_pid()}\n")  # left by a killed run
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert not (store / ".lock").exists()


def test_devices_are_checked_before_the_ranks_start(tiny_model_dir, corpus, tmp_path):
    one_line_error(invoke("distributed-encode", corpus, "-o", tmp_path / "e", "--device", "bogus"), "unknown device")
    one_line_error(
        invoke("distributed-encode", corpus, "-o", tmp_path / "e", "--devices", "cpu,nope"), "unknown device"
    )


def test_cli_reads_a_table_and_refuses_bad_columns_and_folders(tiny_model_dir, tmp_path):
    pytest.importorskip("pyarrow")
    from ..io.test_arrow import ROWS, _table, shard_tables, write_table

    path = write_table(tmp_path / "in.arrow", _table(make_lines(ROWS, seed=3)))
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
        (["--shard-size", "40"], "must be a multiple of chunk_size (16)"),
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
