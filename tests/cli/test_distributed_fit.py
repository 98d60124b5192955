"""`bertflow distributed-fit` end to end: one rank after distributed-encode, what it refuses to write over, stores it
refuses to fit on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import Embedder, WhiteningCalibrator
from bertflow.cli import app
from bertflow.scale.reader import open_embeddings

from ..conftest import CORPUS, invoke, one_line_error, snapshot
from ..safety import encode_store_args
from ..scale.conftest import corpus_file  # noqa: F401 - the fixture


@pytest.fixture()
def corpus(tmp_path):
    """The corpus in a folder of its own, ``tmp_path / "data"``: ``-o`` that folder is "not empty", not "holds the
    input" (the store is elsewhere in ``tmp_path``)."""
    path = tmp_path / "data" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


def test_distributed_fit_refuses_the_store_and_foreign_folders(tiny_model_dir, corpus, tmp_path):
    store = tmp_path / "emb"
    r = invoke(*encode_store_args(corpus, store, tiny_model_dir))
    assert r.exit_code == 0, r.output
    before = snapshot(store)
    one_line_error(
        invoke("distributed-fit", store, "-o", store, "--calibrator", "whitening", "-q", "--overwrite"),
        "holds the input",
    )
    one_line_error(
        invoke("distributed-fit", store, "-o", corpus.parent, "--calibrator", "whitening", "-q"), "not empty"
    )
    assert snapshot(store) == before
    out = tmp_path / "white"
    assert invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q").exit_code == 0
    one_line_error(invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q"), "--overwrite")
    assert invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q", "--overwrite").exit_code == 0
    # distributed-encode into a model folder: not a store, refused even with --overwrite.
    one_line_error(
        invoke("distributed-encode", corpus, "-o", out, "--model", tiny_model_dir, "--overwrite"), "bertflow model"
    )


def test_cli_encode_then_fit_as_one_rank(tiny_model_dir, corpus_file, tmp_path):  # noqa: F811
    path, lines = corpus_file
    runner = CliRunner()
    out, model = tmp_path / "emb", tmp_path / "model"
    args = ["distributed-encode", str(path), "-o", str(out), "--model", str(tiny_model_dir), "--device", "cpu", "-q"]
    r = runner.invoke(app, [*args, "--shard-size", "64", "--chunk-size", "16", "--batch-size", "8"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["rows"] == 203
    r = runner.invoke(app, [*args, "--shard-size", "64", "--chunk-size", "16", "--batch-size", "4"])
    assert r.exit_code == 2 and "batch_size differ" in r.output
    r = runner.invoke(app, ["distributed-fit", str(out), "-o", str(model), "--calibrator", "whitening-8", "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(summary) == ["output", "sentences", "calibrator", "world_size", "seconds"]
    assert (summary["sentences"], summary["world_size"]) == (203, 1)
    embedder = Embedder.load(model)
    assert embedder.calibrator.n_components_ == 8 and embedder.fit_info["n_sentences"] == 203
    expected = WhiteningCalibrator(8).fit(np.asarray(open_embeddings(out)))
    np.testing.assert_allclose(embedder.calibrator.explained_variance_, expected.explained_variance_, rtol=1e-10)
    assert embedder.encode(lines[:4]).shape == (4, 8)
    r = runner.invoke(
        app, ["distributed-fit", str(out), "-o", str(model), "--calibrator", "standard-norm", "-q", "--overwrite"]
    )
    assert r.exit_code == 2 and "supports flow, flow-paper, whitening" in r.output


def test_distributed_fit_refuses_a_store_with_a_flipped_float(tiny_model_dir, corpus_file, tmp_path):  # noqa: F811
    """One changed float in one shard used to give a whitening that kept 1 of 384 directions (every pair 1.000000),
    exit 0. The shard checksums are verified before fitting: a one-line error, exit 2, no model written."""
    path, _ = corpus_file
    runner = CliRunner()
    out, model = tmp_path / "emb", tmp_path / "model"
    args = ["distributed-encode", str(path), "-o", str(out), "--model", str(tiny_model_dir), "--device", "cpu", "-q"]
    assert runner.invoke(app, [*args, "--shard-size", "64", "--chunk-size", "16"]).exit_code == 0
    shard = out / "shards" / "part-000001.npy"
    rows = np.load(shard)
    data = bytearray(shard.read_bytes())
    offset = len(data) - rows.nbytes + 4 * (5 * rows.shape[1] + 3)  # row 5, column 3
    data[offset : offset + 4] = np.float32(1e30).tobytes()
    shard.write_bytes(bytes(data))
    assert np.load(shard)[5, 3] == np.float32(1e30)
    r = runner.invoke(app, ["distributed-fit", str(out), "-o", str(model), "--calibrator", "whitening", "-q"])
    assert r.exit_code == 2 and "part-000001.npy does not match its recorded sha256" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not model.exists()


def test_distributed_fit_refuses_an_old_scheme_fingerprint_before_fitting(tiny_model_dir, corpus_file, tmp_path):  # noqa: F811
    """A store whose recorded encoder fingerprint is not the encoder's (other weights) is refused: no model."""
    path, _ = corpus_file
    runner = CliRunner()
    out, model = tmp_path / "emb", tmp_path / "model"
    args = ["distributed-encode", str(path), "-o", str(out), "--model", str(tiny_model_dir), "--device", "cpu", "-q"]
    assert runner.invoke(app, [*args, "--shard-size", "64", "--chunk-size", "16"]).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["encoder"]["fingerprint"] = "0123456789abcdef"
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = runner.invoke(app, ["distributed-fit", str(out), "-o", str(model), "--calibrator", "whitening", "-q"])
    assert r.exit_code == 2 and "other weights" in r.output and not model.exists()
