"""`bertflow fit` end to end: what it reads, what it refuses, what it writes."""

from __future__ import annotations

from bertflow import Embedder

from ..conftest import SENTENCES
from ..test_embedder import OTHER


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
