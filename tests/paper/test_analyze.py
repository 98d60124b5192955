"""`bertflow analyze`: edit distance, anisotropy measures, the Table 6 analogue and the plots."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from bertflow import SentenceEncoder, WhiteningCalibrator
from bertflow.cli import app
from bertflow.errors import InputError
from bertflow.evaluation.datasets import load_sts_task
from bertflow.paper.analyze import (
    analyze_stsb,
    edit_distances,
    geometry,
    isotropy_score,
    levenshtein,
    lexical_table,
    mean_pairwise_cosine,
    spectrum,
    word_tokens,
)

from ..sts_layout import one_torch_thread, working_tiny_bert, write_sts_layout  # noqa: F401 - fixtures

PNG = b"\x89PNG\r\n\x1a\n"


def test_word_level_levenshtein() -> None:
    assert word_tokens("A man's guitar, played!") == ["a", "man", "'", "s", "guitar", ",", "played", "!"]
    assert levenshtein([], []) == 0 and levenshtein(["a"], []) == 1
    assert levenshtein("kitten".split(), "kitten".split()) == 0
    assert levenshtein(list("kitten"), list("sitting")) == 3  # the classic, on characters as tokens
    assert levenshtein(["a", "b", "c"], ["c", "b", "a"]) == 2
    d = edit_distances(["A man plays a guitar.", "The cat sleeps."], ["A woman plays a guitar.", "the CAT sleeps ."])
    assert d.tolist() == [1, 0] and d.dtype == np.int64


def test_mean_pairwise_cosine_equals_brute_force() -> None:
    x = np.random.default_rng(0).normal(size=(40, 6)) + 0.5
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    brute = np.mean([u[i] @ u[j] for i, j in itertools.permutations(range(40), 2)])
    assert mean_pairwise_cosine(x) == pytest.approx(brute, abs=1e-12)
    assert mean_pairwise_cosine(x * np.arange(1, 41)[:, None]) == pytest.approx(brute, abs=1e-12)  # norm-free
    with pytest.raises(InputError):
        mean_pairwise_cosine(x[:1])


def test_isotropy_score_and_spectrum() -> None:
    rng = np.random.default_rng(0)
    iso = rng.normal(size=(4000, 8))
    cone = iso + 4.0  # every vector near the direction (1, ..., 1)
    assert isotropy_score(iso) > 0.9
    assert isotropy_score(cone) < 0.5 * isotropy_score(iso)
    # Brute force on a small set: Z(c) over the eigenvectors and their negatives.
    x = rng.normal(size=(30, 3)) + 1.0
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    _, vecs = np.linalg.eigh(u.T @ u)
    z = [np.exp(u @ (s * c)).sum() for c in vecs.T for s in (1, -1)]
    assert isotropy_score(x) == pytest.approx(min(z) / max(z), rel=1e-10)
    assert isotropy_score(x * 1e3) == pytest.approx(isotropy_score(x), rel=1e-10)  # rows are normalised
    eig = spectrum(cone)
    assert eig.sum() == pytest.approx(1.0) and np.all(np.diff(eig) <= 1e-12) and eig[0] > 0.8
    g = geometry(iso)
    assert g["effective_rank"] > 7.5 and abs(g["mean_pairwise_cosine"]) < 0.01 and len(g["eigenvalues"]) == 8


def test_lexical_table_hand_computed() -> None:
    gold = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    distance = np.array([0, 1, 2, 3, 5, 9])
    lexical = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])  # ranks exactly by edit distance
    table = lexical_table(gold, {"raw": lexical, "flat": np.ones(6)}, distance)
    assert table["all"]["n"] == 6 and table["small"]["n"] == 4 and table["small"]["max_edit_distance"] == 4
    assert table["all"]["rows"]["gold"]["vs_edit_distance"] == pytest.approx(-100.0)
    assert table["all"]["rows"]["raw"]["vs_gold"] == pytest.approx(100.0)
    assert table["all"]["rows"]["flat"]["vs_gold"] is None  # constant: undefined, not NaN
    rng = np.random.default_rng(1)
    g, d, s = rng.normal(size=50), rng.integers(0, 9, size=50), rng.normal(size=50)
    t = lexical_table(g, {"x": s}, d)
    small = d <= 4
    assert t["small"]["rows"]["x"]["vs_edit_distance"] == pytest.approx(100 * stats.spearmanr(s[small], d[small])[0])


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sts_layout(tmp_path_factory.mktemp("sts-analyze"), n=40)


def test_analyze_stsb_writes_report_and_plots(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:  # noqa: F811
    encoder = SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu")
    out = tmp_path / "analysis"
    result = analyze_stsb(encoder, calibrator="whitening", regime="target", data_dir=layout, out_dir=out)
    task = load_sts_task("STS-B", layout)
    test = task.eval_subsets["test"]
    # The raw similarity row equals a direct computation.
    raw = encoder.encode(test.sentences1), encoder.encode(test.sentences2)
    cos = (raw[0] * raw[1]).sum(1) / (np.linalg.norm(raw[0], axis=1) * np.linalg.norm(raw[1], axis=1))
    assert result.lexical["all"]["rows"]["raw"]["vs_gold"] == pytest.approx(
        100 * stats.spearmanr(cos, test.scores)[0], abs=1e-3
    )
    assert result.lexical["all"]["n"] == len(test)
    # Whitening fitted on all STS-B sentences: the calibrated test embeddings are close to isotropic.
    white = WhiteningCalibrator().fit(encoder.encode(task.fit_sentences("target")))
    z = white.transform(encoder.encode(task.eval_sentences()))
    assert result.geometry["calibrated"]["mean_pairwise_cosine"] == pytest.approx(mean_pairwise_cosine(z), abs=1e-5)
    assert result.geometry["calibrated"]["mean_pairwise_cosine"] < result.geometry["raw"]["mean_pairwise_cosine"]
    assert result.meta["test_seen"].endswith("(transductive)")
    assert sorted(result.plots) == sorted(
        ["spectrum.png", "cosine_hist.png", "similarity_vs_gold.png", "similarity_vs_edit_distance.png"]
    )  # PNG only unless vector formats are asked for
    for name in result.plots:
        assert (out / name).read_bytes().startswith(PNG)
    data = json.loads((out / "analyze.json").read_text())
    assert data["paper_table6"]["rows"]["calibrated"]["vs_gold"] == 74.09
    md = (out / "analyze.md").read_text()
    assert "word-level Levenshtein" in md and "![spectrum.png](spectrum.png)" in md and "-28.01" in md
    assert math.isfinite(data["geometry"]["raw"]["isotropy_score"])


def test_analyze_compares_calibrators_and_writes_vector_plots(
    working_tiny_bert: Path,  # noqa: F811
    layout: Path,
    tmp_path: Path,
) -> None:
    encoder = SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu")
    out = tmp_path / "cmp"
    result = analyze_stsb(
        encoder, calibrator="standard-norm", compare=["whitening"], data_dir=layout, out_dir=out, vector=["pdf", "svg"]
    )
    assert list(result.geometry) == ["raw", "calibrated", "whitening"]
    assert list(result.lexical["all"]["rows"]) == ["gold", "raw", "calibrated", "whitening"]
    # The compared whitening is the same fit as analysing whitening on its own.
    alone = analyze_stsb(encoder, calibrator="whitening", data_dir=layout)
    assert result.lexical["all"]["rows"]["whitening"] == alone.lexical["all"]["rows"]["calibrated"]
    assert result.geometry["whitening"]["mean_pairwise_cosine"] == pytest.approx(
        alone.geometry["calibrated"]["mean_pairwise_cosine"], abs=1e-6
    )
    stems = ["spectrum", "cosine_hist", "similarity_vs_gold", "similarity_vs_edit_distance"]
    assert sorted(result.plots) == sorted(f"{s}.{ext}" for s in stems for ext in ("png", "pdf", "svg"))
    for stem in stems:
        assert (out / f"{stem}.png").read_bytes().startswith(PNG)
        assert (out / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
        assert b"<svg" in (out / f"{stem}.svg").read_bytes()[:2000]
    md = (out / "analyze.md").read_text()
    assert "| measure | raw | calibrated | whitening | isotropic ideal |" in md and "[spectrum.pdf](spectrum.pdf)" in md
    assert "![spectrum.pdf]" not in md  # only PNGs are embedded
    assert json.loads((out / "analyze.json").read_text())["meta"]["compare"] == ["whitening"]
    with pytest.raises(InputError, match="unknown plot format 'eps'"):
        analyze_stsb(encoder, calibrator="whitening", data_dir=layout, out_dir=tmp_path / "x", vector=["eps"])
    with pytest.raises(InputError, match="unknown calibrator"):
        analyze_stsb(encoder, calibrator="whitening", compare=["pca"], data_dir=layout)
    assert not (tmp_path / "x").exists()  # bad options fail before anything is written


def test_cli_analyze_saved_model_without_plots(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:  # noqa: F811
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(load_sts_task("STS-B", layout).fit_sentences("train")) + "\n", encoding="utf-8")
    runner = CliRunner()
    model_dir = tmp_path / "fitted"
    r = runner.invoke(
        app, ["fit", str(corpus), "-o", str(model_dir), "--model", str(working_tiny_bert), "--calibrator",
              "standard-norm", "-q"]
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "an"
    r = runner.invoke(
        app, ["analyze", "--model-dir", str(model_dir), "--data-dir", str(layout), "-o", str(out), "--no-plots",
              "--no-cache", "-q"]
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "analyze.json").read_text())
    assert data["plots"] == [] and data["meta"]["calibrator"] == "standard-norm"
    assert data["meta"]["test_seen"].startswith("unknown")
    assert "Similarity vs edit distance" in r.stdout


def test_cli_analyze_compare_and_bad_vector_format(
    working_tiny_bert: Path,  # noqa: F811
    layout: Path,
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    out = tmp_path / "cmp"
    r = runner.invoke(
        app, ["analyze", "--model", str(working_tiny_bert), "--calibrator", "standard-norm", "--compare", "whitening",
              "--data-dir", str(layout), "--no-cache", "--no-plots", "-o", str(out), "-q"]
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "analyze.json").read_text())
    assert data["meta"]["compare"] == ["whitening"] and list(data["geometry"]) == ["raw", "calibrated", "whitening"]
    assert "--compare whitening" in data["meta"]["command"]
    bad = runner.invoke(
        app, ["analyze", "--model", str(working_tiny_bert), "--vector", "eps", "--data-dir", str(layout), "--no-cache",
              "-o", str(tmp_path / "bad"), "-q"]
    )  # fmt: skip
    assert bad.exit_code == 2 and "unknown plot format 'eps'" in bad.output
    assert not (tmp_path / "bad").exists()
