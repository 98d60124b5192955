"""`bertflow analyze` (bertflow.paper.analyze): the Table 6 analogue, the anisotropy before and after calibration, the
report and plots it writes, and the command line."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from bertflow import SentenceEncoder, WhiteningCalibrator
from bertflow.cli import app
from bertflow.evaluation.datasets import load_sts_task
from bertflow.paper.analyze import analyze_stsb
from bertflow.paper.measures import mean_pairwise_cosine

from ..sts_layout import one_torch_thread, working_tiny_bert, write_sts_layout  # noqa: F401 - fixtures

PNG = b"\x89PNG\r\n\x1a\n"


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
