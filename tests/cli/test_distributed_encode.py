"""`bertflow distributed-encode` end to end: checks before any rank starts, one store per run."""

from __future__ import annotations

from ..conftest import SENTENCES


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
