"""Bad input, degenerate data, damaged files and determinism: every case of docs/robustness.md has a test here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bertflow import (
    Embedder,
    FlowCalibrator,
    InputError,
    SentenceEncoder,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.cli import app
from bertflow.io.text import read_pairs, read_tsv_column

from .conftest import SENTENCES

runner = CliRunner()
PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- text input -------------------------------------------------------------------------------------------


def test_one_megabyte_line_is_truncated_not_fatal(tiny_encoder):
    line = "guitar music " * 80_000  # ~1 MB
    assert len(line) > 1_000_000
    v = tiny_encoder.encode(line)
    assert v.shape == (tiny_encoder.dim,) and np.isfinite(v).all()


@pytest.mark.slow
def test_emoji_cjk_and_rtl_text(default_encoder):
    texts = ["I love pizza 🍕🔥", "我喜欢吃披萨。", "אני אוהב פיצה", "أنا أحب البيتزا", "I love pizza."]
    z = default_encoder.encode(texts)
    assert np.isfinite(z).all()
    # Non-Latin scripts are not collapsed to one [UNK] vector: the vectors differ from one another.
    sims = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ (z / np.linalg.norm(z, axis=1, keepdims=True)).T
    assert sims[np.triu_indices(len(texts), 1)].max() < 0.999


def test_nan_from_a_broken_model_is_reported(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    with torch.no_grad():
        enc.model.encoder.layer[0].output.dense.weight.fill_(float("nan"))
    with pytest.raises(InputError, match="NaN or Inf .*row 0"):
        enc.encode(SENTENCES)


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


def test_tsv_with_missing_columns(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("score\tsentence1\tsentence2\n3.0\tA man.\tA woman.\n2.0\tonly one sentence\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 3"):
        read_pairs(tsv)
    with pytest.raises(InputError, match="line 3"):
        read_tsv_column(tsv, "sentence2")


@given(st.binary(max_size=400))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_tsv_readers_fuzz(tmp_path_factory, raw):
    """Arbitrary bytes: the TSV readers either return data or raise InputError, nothing else."""
    path = tmp_path_factory.mktemp("fuzz") / "f.tsv"
    path.write_bytes(b"score\tsentence1\tsentence2\n" + raw)
    for read in (lambda: read_pairs(path), lambda: read_tsv_column(path, "sentence1", errors="replace")):
        try:
            read()
        except InputError:
            pass


# -- small and degenerate data ----------------------------------------------------------------------------


def test_too_small_corpus_whitening_warns_and_flow_refuses(caplog):
    x = np.random.default_rng(0).normal(size=(20, 64))
    z = WhiteningCalibrator().fit_transform(x)
    assert "20 sentences for 64 dimensions" in caplog.text and np.isfinite(z).all()
    with pytest.raises(InputError, match="minimum of 32"):
        FlowCalibrator().fit(x)


def test_flow_refuses_identical_rows():
    x = np.tile(np.random.default_rng(0).normal(size=(1, 16)), (100, 1))
    with pytest.raises(InputError, match="duplicates"):
        FlowCalibrator(max_steps=5).fit(x)


@pytest.mark.parametrize(
    ("preset", "kwargs"),
    [("code", {}), ("paper", {}), ("code", {"coupling": "affine"}), ("code", {"permutation": "lu"})],
)
@pytest.mark.parametrize("case", ["duplicated_rows", "constant_dimension", "huge_norms"])
def test_flow_on_degenerate_inputs_stays_finite(preset, kwargs, case):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 24)) @ rng.normal(size=(24, 24))
    if case == "duplicated_rows":
        x = np.repeat(x[:30], 10, axis=0)
    elif case == "constant_dimension":
        x[:, 5] = 3.0
    else:
        x = x * 1e6
    cal = FlowCalibrator(preset, max_steps=40, **kwargs).fit(x)
    z = cal.transform(x)
    assert np.isfinite(z).all() and np.isfinite(cal.history_["train_bpd"]).all()
    assert np.isfinite(cal.score_samples(x)).all()


# -- property-based checks of the calibrators ---------------------------------------------------------------


@given(n=st.integers(40, 120), d=st.integers(2, 12), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 10_000))
@PROPERTY
def test_linear_calibrators_invert(n, d, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)) * scale
    for cal in (StandardNormCalibrator(), WhiteningCalibrator(rcond=1e-9)):
        z = cal.fit_transform(x)
        if z.shape[1] == d:
            np.testing.assert_allclose(cal.inverse_transform(z), x, rtol=1e-3, atol=1e-3 * scale)


@given(d=st.integers(8, 20), seed=st.integers(0, 10_000), scale=st.sampled_from([1e-3, 1.0, 1e3]))
@PROPERTY
def test_flow_transform_is_finite_and_invertible(d, seed, scale):
    x = np.random.default_rng(seed).normal(size=(64, d)) * scale
    cal = FlowCalibrator(max_steps=3, seed=seed).fit(x)
    z = cal.transform(x)
    assert np.isfinite(z).all()
    np.testing.assert_allclose(cal.inverse_transform(z), x, rtol=1e-3, atol=1e-3 * scale)


# -- determinism ------------------------------------------------------------------------------------------


def test_same_seed_same_files_and_embeddings(tiny_encoder, tmp_path):
    corpus = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]
    paths = []
    for name in ("a", "b"):
        paths.append(Embedder(tiny_encoder, FlowCalibrator(max_steps=25, seed=7)).fit(corpus).save(tmp_path / name))
    weights = [(p / "calibrator" / "model.safetensors").read_bytes() for p in paths]
    assert weights[0] == weights[1]
    a, b = (Embedder.load(p).encode(SENTENCES) for p in paths)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(tiny_encoder.encode(SENTENCES), tiny_encoder.encode(SENTENCES))


def test_an_overflowing_transform_is_not_blamed_on_the_model(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    with pytest.raises(InputError, match="transform .* turned finite embeddings .* into NaN or Inf"):
        enc.encode(SENTENCES, transform=lambda x: x * float("inf"))
