"""`bertflow fit` end to end: what it reads, what it refuses, what it writes."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import (
    Embedder,
)
from bertflow.cli import app
from bertflow.errors import OutputError

from ..conftest import CORPUS, SENTENCES, cli, invoke, one_line_error, snapshot
from ..safety import fit_args
from ..test_embedder import OTHER

runner = CliRunner()


def test_cli_fit_with_weighting_and_token_stats(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from bertflow.cli import app

    corpus = tmp_path / "fit.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("\n".join(OTHER) + "\n", encoding="utf-8")
    common = ["fit", str(corpus), "-m", str(tiny_model_dir), "--calibrator", "whitening-4", "-q", "--device", "cpu"]
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            *common,
            "-o",
            str(tmp_path / "m"),
            "--pooling",
            "mean",
            "--weighting",
            "idf",
            "--token-stats",
            str(tokens),
            "--token-source",
            "both",
        ],
    )
    assert result.exit_code == 0, result.output
    model = Embedder.load(tmp_path / "m")
    assert model.encoder.pooling.name == "idf:mean"
    assert model.encoder.token_statistics == model.encoder.count_tokens(SENTENCES * 3 + OTHER)
    bad = runner.invoke(app, [*common, "-o", str(tmp_path / "x"), "--pooling", "sif:mean", "--weighting", "idf"])
    assert bad.exit_code == 2 and "give the weighting once" in bad.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_fit_prints_one_summary_line_with_the_flows_last_bits_per_dimension(tiny_model_dir, corpus, tmp_path):
    for calibrator, last in (("flow", ["final_train_bpd"]), ("standard-norm", [])):
        r = invoke("fit", corpus, "-o", tmp_path / calibrator, "--model", tiny_model_dir, "--calibrator", calibrator)
        assert r.exit_code == 0, r.output
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert list(summary) == ["output", "sentences", "calibrator", "seconds", *last], calibrator
        assert summary["sentences"] == len(CORPUS) and summary["output"] == str(tmp_path / calibrator)


def test_fit_reads_standard_input(tiny_model_dir, corpus, tmp_path):
    proc = cli("fit", "-", "-o", tmp_path / "m", "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q",
               stdin=corpus.read_bytes())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.decode().splitlines()[-1])["sentences"] == len(CORPUS)
    from_file = runner.invoke(
        app, ["fit", str(corpus), "-o", str(tmp_path / "f"), "--model", str(tiny_model_dir), "--calibrator",
              "standard-norm", "-q"]
    )  # fmt: skip
    assert from_file.exit_code == 0
    # The same fit (two processes, whose thread counts may differ: float32 sums in another order, 1e-7 apart).
    np.testing.assert_allclose(Embedder.load(tmp_path / "m").encode(CORPUS[:5]),
                               Embedder.load(tmp_path / "f").encode(CORPUS[:5]), atol=1e-5)  # fmt: skip
    assert Embedder.load(tmp_path / "m").fit_info["regime"] == "corpus <stdin>"


def test_blank_lines_and_duplicates_in_a_corpus(tiny_model_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    lines = SENTENCES * 8 + ["", "   "]  # 64 lines with duplicates, then blank lines
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--model", str(tiny_model_dir), "--calibrator", "standard-norm", "-q"]
    r = runner.invoke(app, ["fit", str(corpus), "-o", str(tmp_path / "a"), *common])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[-1])["sentences"] == 64  # blanks skipped, duplicates kept
    r = runner.invoke(app, ["fit", str(corpus), "-o", str(tmp_path / "b"), "--unique", *common])
    assert json.loads(r.stdout.splitlines()[-1])["sentences"] == len(SENTENCES)
    # encode keeps one row per line, so a blank line is an error naming it, and no partial .npy is left.
    r = runner.invoke(app, ["encode", str(corpus), "-o", str(tmp_path / "x.npy"), "--model", str(tiny_model_dir)])
    assert r.exit_code == 2 and "line 65 is blank" in r.stderr
    assert not list(tmp_path.glob("x.npy*"))


def test_overwrite_refuses_a_model_folder_holding_foreign_files(tiny_model_dir, corpus, saved_model):
    loaded = Embedder.load(saved_model)
    (saved_model / "scores.tsv").write_text("cosine\tscore\n0.5\t3\n", encoding="utf-8")
    (saved_model / "notes").mkdir()
    (saved_model / "notes" / "todo.txt").write_text("mine", encoding="utf-8")
    (saved_model / "calibrator" / "extra.txt").write_text("mine too", encoding="utf-8")
    before = snapshot(saved_model)
    args = ["fit", corpus, "-o", saved_model, "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q"]
    args.append("--overwrite")
    line = one_line_error(invoke(*args), "did not write", "calibrator/extra.txt", "notes/", "scores.tsv")
    assert "todo.txt" not in line  # a foreign sub-folder is named once
    assert snapshot(saved_model) == before
    with pytest.raises(OutputError, match="scores.tsv"):
        loaded.save(saved_model, overwrite=True)
    assert snapshot(saved_model) == before
    # Once they are moved out, --overwrite replaces the model (its README, bundled encoder and lock are its own).
    for name in ("scores.tsv", "notes/todo.txt", "calibrator/extra.txt"):
        (saved_model / name).unlink()
    (saved_model / "notes").rmdir()
    assert invoke(*args).exit_code == 0
    Embedder.load(saved_model).save(saved_model, overwrite=True, include_encoder=True)
    Embedder.load(saved_model).save(saved_model, overwrite=True)


def test_a_full_disk_inside_the_safetensors_write_is_one_line(tiny_model_dir, corpus, tmp_path, monkeypatch):
    import builtins
    import errno

    import bertflow.io.formats as formats

    class FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[: len(data) // 2])  # part of it fits, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        fh = builtins.open(path, mode, *args, **kwargs)
        return FullDisk(fh) if str(path).endswith(".safetensors") and "w" in mode else fh

    monkeypatch.setattr(formats, "open", open_on_a_full_disk, raising=False)
    out = tmp_path / "m"
    args = ["fit", corpus, "-o", out, "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q"]
    one_line_error(invoke(*args), "disk full", status=1)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]


def test_an_empty_tsv_cell_is_named_by_file_line_and_column(tiny_model_dir, tmp_path):
    tsv = tmp_path / "train.tsv"
    rows = [f"{a}\t{b}" for a, b in zip(CORPUS[:10], CORPUS[10:20], strict=True)]
    rows[6] = f"{CORPUS[6]}\t   "
    tsv.write_text("sentence1\tsentence2\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "m"
    args = ["fit", tsv, "-c", "sentence1", "-c", "sentence2", "-o", out, "--model", tiny_model_dir, "-q"]
    one_line_error(invoke(*args), "train.tsv: line 8, column 'sentence2' is empty")
    assert not out.exists()


def test_fit_encode_similarity(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "model"
    r = invoke("fit", corpus, "-o", out, "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["sentences"] == 64
    r = invoke("encode", corpus, "-o", tmp_path / "z.npy", "--model-dir", out, "-q")
    assert r.exit_code == 0, r.output
    z = np.load(tmp_path / "z.npy")
    assert z.shape == (64, 32) and np.isfinite(z).all()
    from bertflow import Embedder

    lines = corpus.read_text().splitlines()
    np.testing.assert_allclose(z, Embedder.load(out).encode(lines), atol=1e-5)
    r = invoke("similarity", "The cat sleeps.", "The cat sleeps.", "--model-dir", out)
    assert r.exit_code == 0 and float(r.stdout) == pytest.approx(1.0, abs=1e-5)


def test_fit_from_tsv_columns(tiny_model_dir, tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text(
        "score\tsentence1\tsentence2\n" + "".join(f"1\t{a} {b}\t{b} {a}\n" for a in SENTENCES for b in SENTENCES[:5]),
        encoding="utf-8",
    )
    r = invoke(
        "fit",
        tsv,
        "-c",
        "sentence1",
        "-c",
        "sentence2",
        "-o",
        tmp_path / "m",
        "--model",
        tiny_model_dir,
        "--calibrator",
        "standard-norm",
        "-q",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["sentences"] == 80
    r = invoke("fit", tsv, "-c", "nope", "-o", tmp_path / "m2", "--model", tiny_model_dir)
    assert r.exit_code == 2 and "nope" in r.stderr


def test_fit_refuses_the_folder_holding_its_corpus(tiny_model_dir, corpus):
    before = snapshot(corpus.parent)
    one_line_error(invoke(*fit_args(corpus, corpus.parent, tiny_model_dir)), "holds the input")
    one_line_error(invoke(*fit_args(corpus, corpus.parent, tiny_model_dir), "--overwrite"), "holds the input")
    assert snapshot(corpus.parent) == before


def test_fit_refuses_the_working_directory(tiny_model_dir, corpus, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    for out in (".", str(work), ".."):
        one_line_error(invoke(*fit_args(corpus, out, tiny_model_dir), "--overwrite"), "working directory")
    assert (work / "notes.txt").read_text() == "mine"


def test_fit_refuses_a_foreign_folder_and_replaces_a_model_only_with_overwrite(tiny_model_dir, corpus, tmp_path):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    one_line_error(invoke(*fit_args(corpus, foreign, tiny_model_dir), "--overwrite"), "not empty", "cat.jpg")
    assert (foreign / "cat.jpg").read_bytes() == b"\xff\xd8"

    out = tmp_path / "model"
    assert invoke(*fit_args(corpus, out, tiny_model_dir)).exit_code == 0
    first = snapshot(out)
    one_line_error(invoke(*fit_args(corpus, out, tiny_model_dir)), "already holds a bertflow model", "--overwrite")
    assert snapshot(out) == first
    r = invoke(*fit_args(corpus, out, tiny_model_dir), "--overwrite")
    assert r.exit_code == 0, r.output
    assert Embedder.load(out).calibrator.name == "standard-norm"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke(*fit_args(corpus, empty, tiny_model_dir)).exit_code == 0  # an empty folder is fine


def test_a_read_only_destination_fails_before_the_fit(tiny_model_dir, corpus, tmp_path, monkeypatch, no_model_loading):
    ro = tmp_path / "ro"
    ro.mkdir()
    real_open = os.open

    def read_only_fs(path, flags, *args, **kwargs):
        if str(path).startswith(str(ro)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_fs)
    one_line_error(invoke(*fit_args(corpus, ro / "model", tiny_model_dir)), "not writable", "Read-only")
    one_line_error(invoke("encode", corpus, "-o", ro / "x.npy", "--model", tiny_model_dir), "not writable")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_fails_before_the_fit(tiny_model_dir, corpus, tmp_path, no_model_loading):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        one_line_error(invoke(*fit_args(corpus, ro / "model", tiny_model_dir)), "not writable")
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        pytest.param(
            ["--device", "cuda"],
            "CUDA is not available",
            id="device-cuda",
            marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA"),
        ),
        pytest.param(["--device", "bogus"], "unknown device", id="device-bogus"),
        pytest.param(["--epochs", "inf"], "epochs", id="epochs-inf"),
        pytest.param(["--epochs", "nan"], "epochs", id="epochs-nan"),
        pytest.param(["--epochs", "0"], "epochs", id="epochs-0"),
        pytest.param(["--epochs", "-1"], "epochs", id="epochs-negative"),
        pytest.param(["--max-length", "100000"], "max_length 100000", id="max-length-above-positions"),
        pytest.param(["-c", "²"], "²", id="column-superscript-two"),
        pytest.param(["--pooling", "max"], "unknown pooling", id="pooling-unknown"),
        pytest.param(["--pooling", "1,99"], "out of range", id="pooling-layer-out-of-range"),
    ],
)
def test_bad_options_are_one_line_before_loading_the_model(
    tiny_model_dir, corpus, tmp_path, options, needle, no_model_loading
):
    target = corpus
    if options[0] == "-c":
        target = tmp_path / "t.tsv"
        target.write_text("score\tsentence1\n1\tA man plays.\n", encoding="utf-8")
    one_line_error(invoke(*fit_args(target, tmp_path / "m", tiny_model_dir), *options), needle)
    assert not (tmp_path / "m").exists()
