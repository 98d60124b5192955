"""``bertflow encode`` end to end: what it reads (text, standard input, FIFOs; Parquet / Arrow tables, streamed, ids
carried over, the same vectors as the text path: issue 25 item 1), what it refuses, what it writes."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import Embedder, WhiteningCalibrator
from bertflow.cli import EXIT_USAGE, app

from ..conftest import CORPUS, SENTENCES, cli, invoke, one_line_error
from ..safety import fit_args

runner = CliRunner()

try:
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq
except ImportError:  # the arrow extra: the table tests skip, the text ones still run
    pa = feather = pq = None

needs_pyarrow = pytest.mark.skipif(pa is None, reason="pyarrow is not installed (the arrow extra)")

LINES = [f"{a} {b}" for a in SENTENCES for b in SENTENCES][:50]


@pytest.fixture(scope="module")
def model_dir(tiny_encoder, tmp_path_factory) -> Path:
    return Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(LINES).save(tmp_path_factory.mktemp("m") / "model")


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    table = pa.table({"doc_id": pa.array([f"d{i:03d}" for i in range(len(LINES))]), "body": LINES})
    (tmp_path / "lines.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=16)  # several row groups, streamed
    feather.write_feather(table, tmp_path / "data.arrow", chunksize=16)
    return {"text": tmp_path / "lines.txt", "parquet": tmp_path / "data.parquet", "arrow": tmp_path / "data.arrow"}


@needs_pyarrow
def test_tables_in_and_out_give_the_text_paths_vectors_with_ids(model_dir, inputs, tmp_path):
    r = invoke("encode", inputs["text"], "-o", tmp_path / "want.npy", "--model-dir", model_dir, "-q")
    assert r.exit_code == 0, r.output
    want = np.load(tmp_path / "want.npy")
    for kind in ("parquet", "arrow"):
        table_args = ["--text-column", "body", "--model-dir", model_dir, "-q"]
        out = tmp_path / f"vectors-{kind}.{kind}"
        r = invoke("encode", inputs[kind], "-o", out, *table_args, "--id-column", "doc_id")
        assert r.exit_code == 0, r.output
        got = pq.read_table(out) if kind == "parquet" else feather.read_table(out)
        assert got.column_names == ["row", "doc_id", "embedding"]
        assert got.column("doc_id").to_pylist() == [f"d{i:03d}" for i in range(len(LINES))]
        assert got.column("row").to_pylist() == list(range(len(LINES)))
        np.testing.assert_array_equal(np.stack(got.column("embedding").to_numpy(zero_copy_only=False)), want)
        r = invoke("encode", inputs[kind], "-o", tmp_path / f"{kind}.npy", *table_args)  # table in, .npy out
        assert r.exit_code == 0, r.output
        np.testing.assert_array_equal(np.load(tmp_path / f"{kind}.npy"), want)
    r = invoke("encode", inputs["text"], "-o", tmp_path / "from-text.arrow", "--model-dir", model_dir, "-q")
    assert r.exit_code == 0, r.output  # text in, table out: the row column numbers the lines
    got = feather.read_table(tmp_path / "from-text.arrow")
    assert got.column_names == ["row", "embedding"] and got.num_rows == len(LINES)
    np.testing.assert_array_equal(np.stack(got.column("embedding").to_numpy(zero_copy_only=False)), want)


@needs_pyarrow
def test_table_options_that_do_not_fit_are_usage_errors(model_dir, inputs, tmp_path):
    base = ["--model-dir", model_dir, "-q"]
    parquet, text = inputs["parquet"], inputs["text"]
    cases = [
        ([parquet, "-o", tmp_path / "x.npy", "--text-column", "body", "--id-column", "doc_id"], "needs a table output"),
        ([text, "-o", tmp_path / "x.parquet", "--text-column", "body"], "apply to a .parquet / .arrow input"),
        ([parquet, "-o", tmp_path / "x.parquet", "-c", "body"], "--column is for a TSV input"),
        ([parquet, "-o", tmp_path / "x.parquet"], "has no column 'text'; its columns: doc_id, body"),
        ([parquet, "-o", tmp_path / "x.parquet", "--text-column", "doc_id", "--id-column", "nope"], "no column 'nope'"),
    ]
    for args, message in cases:
        r = invoke("encode", *args, *base)
        assert r.exit_code == EXIT_USAGE and message in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("x.")]  # nothing written
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["fine", None, "also fine"]}), nulls)
    r = invoke("encode", nulls, "-o", tmp_path / "y.parquet", *base)
    assert r.exit_code == EXIT_USAGE and "1 null value(s), the first at row 1" in r.stderr
    assert not (tmp_path / "y.parquet").exists()


def test_cr_only_line_ends_are_refused_not_read_as_one_sentence(tiny_model_dir, tmp_path):
    from bertflow.errors import InputError
    from bertflow.io.text import read_pairs, read_sentences, read_tsv_column

    mac = tmp_path / "mac.txt"
    mac.write_bytes("\r".join(CORPUS[:60]).encode() + b"\r")
    out = tmp_path / "v.npy"
    one_line_error(invoke("encode", mac, "-o", out, "--model", tiny_model_dir, "-q"), "line 1", "carriage return")
    assert not out.exists()
    with pytest.raises(InputError, match="CR-only"):
        read_sentences(mac)
    tsv = tmp_path / "mac.tsv"
    tsv.write_bytes(b"sentence1\tsentence2\tscore\ra\tb\t1\r")
    for read in (lambda: read_tsv_column(tsv, "sentence1"), lambda: read_pairs(tsv)):
        with pytest.raises(InputError, match="carriage return"):
            read()
    # CRLF, and a lone CR that only ends the file, are line ends.
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"one\r\ntwo\r")
    assert read_sentences(ok) == ["one", "two"]


def test_a_mistyped_model_path_or_an_offline_hub_id_is_one_line_at_once(corpus, tmp_path, monkeypatch):
    from bertflow import SentenceEncoder
    from bertflow.errors import InputError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    out = tmp_path / "v.npy"
    cases = {
        "../no/such/bert-folder": "no such folder",
        str(tmp_path / "bert-typo"): "no such folder",
        str(corpus): "it is a file",
        "bert-gutenbrg": "HF_HUB_OFFLINE",
        "someone/no-such-model": "HF_HUB_OFFLINE",
    }
    for name, needle in cases.items():
        one_line_error(invoke("encode", corpus, "-o", out, "-m", name, "-q"), repr(name), needle)
        with pytest.raises(InputError, match=needle):
            SentenceEncoder(name)
    assert not out.exists()


def test_bad_utf8_is_a_clear_error(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nsecond \xff line\n")
    r = invoke("encode", bad, "-o", tmp_path / "x.npy", "--model", tiny_model_dir, "-q")
    assert r.exit_code == 2
    assert "line 2" in r.stderr and "--encoding-errors replace" in r.stderr
    assert not (tmp_path / "x.npy").exists()
    r = invoke("encode", bad, "-o", tmp_path / "x.npy", "--model", tiny_model_dir, "-q", "--encoding-errors", "replace")
    assert r.exit_code == 0 and np.load(tmp_path / "x.npy").shape == (2, 32)


def test_encode_refuses_to_write_over_its_input(tiny_model_dir, corpus, tmp_path):
    before = corpus.read_bytes()
    one_line_error(invoke("encode", corpus, "-o", corpus, "--model", tiny_model_dir, "-q"), "is the input")
    link = tmp_path / "link.npy"
    link.symlink_to(corpus)
    one_line_error(invoke("encode", corpus, "-o", link, "--model", tiny_model_dir, "-q"), "is the input")
    hard = tmp_path / "hard.npy"
    os.link(corpus, hard)
    one_line_error(invoke("encode", corpus, "-o", hard, "--model", tiny_model_dir, "-q"), "is the input")
    assert corpus.read_bytes() == before


def test_disk_full_is_one_line_and_leaves_nothing(tiny_model_dir, corpus, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "x.npy"
    one_line_error(invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q"), "disk full", status=1)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".x.npy")]
    one_line_error(invoke(*fit_args(corpus, tmp_path / "m", tiny_model_dir)), "disk full", status=1)
    assert not (tmp_path / "m").exists()


def test_encode_reads_a_fifo_once(tiny_model_dir, tiny_encoder, tmp_path):
    fifo = tmp_path / "lines.fifo"
    os.mkfifo(fifo)
    lines = CORPUS[:20]

    def feed():
        with open(fifo, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    out = tmp_path / "x.npy"
    proc = cli("encode", fifo, "-o", out, "--model", tiny_model_dir, "--pooling", "mean", "-q", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr.decode()
    feeder.join(5)
    np.testing.assert_allclose(np.load(out), tiny_encoder.encode(lines), atol=1e-5)
    assert json.loads(proc.stdout)["rows"] == 20


def test_encode_stdin_to_stdout(tiny_model_dir, tiny_encoder):
    import io

    lines = CORPUS[:7]
    proc = cli(
        "encode",
        "-",
        "-o",
        "-",
        "--model",
        tiny_model_dir,
        "-q",
        "--device",
        "cpu",
        stdin=("\n".join(lines) + "\n").encode(),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    got = np.load(io.BytesIO(proc.stdout))
    assert got.shape == (7, 32)
    np.testing.assert_allclose(got, tiny_encoder.encode(lines), atol=1e-5)
    assert json.loads(proc.stderr.decode().strip().splitlines()[-1])["rows"] == 7  # the summary goes to stderr


def test_encode_streams_a_pipe_without_reading_it_twice(tiny_model_dir):
    """``/dev/stdin`` on a pipe used to be counted, then found empty ("changed while it was being encoded")."""
    proc = cli(
        "encode",
        "/dev/stdin",
        "-o",
        "-",
        "--model",
        tiny_model_dir,
        "-q",
        "--device",
        "cpu",
        stdin=b"one line\nanother line\n",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    import io

    assert np.load(io.BytesIO(proc.stdout)).shape == (2, 32)


def test_a_blank_line_in_a_stream_is_an_error_and_no_output(tiny_model_dir, tmp_path):
    out = tmp_path / "x.npy"
    proc = cli("encode", "-", "-o", out, "--model", tiny_model_dir, "-q", "--device", "cpu", stdin=b"one\n\nthree\n")
    assert proc.returncode == 2
    assert "line 2 is blank" in proc.stderr.decode() and not out.exists()


def test_encode_help_documents_stdin_and_stdout():
    r = runner.invoke(app, ["encode", "--help"])
    text = " ".join(r.stdout.replace("│", " ").split())  # rich wraps the help column at any word
    assert "standard input" in text and "standard output" in text
