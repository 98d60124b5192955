"""The plots of `bertflow analyze` (bertflow.paper.plots): PNG, PDF and SVG files, one series per compared
calibrator."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertflow import SentenceEncoder
from bertflow.errors import InputError
from bertflow.paper.analyze import analyze_stsb

from ..sts_layout import one_torch_thread, working_tiny_bert  # noqa: F401 - fixtures
from .test_analyze import PNG, layout  # noqa: F401 - the analysis layout (40 pairs a file)


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
