"""The `bertflow` command, driven as a user would (typer's runner, in-process)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow.cli import app

from .conftest import SENTENCES

runner = CliRunner()


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(f"{a} {b}" for a in SENTENCES for b in SENTENCES) + "\n", encoding="utf-8")
    return path


def invoke(*args: str):
    from bertflow.errors import BertflowError

    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, (SystemExit, BertflowError)):
        raise result.exception
    return result


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


def test_similarity_pairs_file(tiny_model_dir, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "score\tsentence1\tsentence2\n"
        + "".join(f"{i % 5}\t{SENTENCES[i]}\t{SENTENCES[-1 - i]}\n" for i in range(len(SENTENCES))),
        encoding="utf-8",
    )
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-o", tmp_path / "out.tsv")
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "out.tsv").read_text().splitlines()
    assert rows[0] == "cosine\tgold\tsentence1\tsentence2" and len(rows) == len(SENTENCES) + 1
    assert "spearman" in r.stderr


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


def test_bad_utf8_is_a_clear_error(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nsecond \xff line\n")
    r = invoke("encode", bad, "-o", tmp_path / "x.npy", "--model", tiny_model_dir, "-q")
    assert r.exit_code == 2
    assert "line 2" in r.stderr and "--encoding-errors replace" in r.stderr
    assert not (tmp_path / "x.npy").exists()
    r = invoke("encode", bad, "-o", tmp_path / "x.npy", "--model", tiny_model_dir, "-q", "--encoding-errors", "replace")
    assert r.exit_code == 0 and np.load(tmp_path / "x.npy").shape == (2, 32)


def test_user_errors_exit_2(tiny_model_dir, tmp_path, corpus):
    r = invoke("similarity", "only one", "--model", tiny_model_dir)
    assert r.exit_code == 2 and "exactly two" in r.stderr
    r = invoke("fit", corpus, "-o", tmp_path / "m", "--model", tiny_model_dir, "--pooling", "max")
    assert r.exit_code == 2 and "unknown pooling" in r.stderr
    r = invoke("encode", corpus, "-o", tmp_path / "x.npy", "--model-dir", tmp_path / "missing")
    assert r.exit_code == 2


def test_help_has_examples():
    for cmd in ("fit", "encode", "similarity"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Examples" in r.stdout
