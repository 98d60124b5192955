"""``auto`` cells of ``bertflow reproduce`` / ``evaluate`` fit the rule through the same function as ``Embedder.fit``
(:func:`bertflow.autofit.fit_auto`): on a raw encoder both switch to the SIF-weighted pooling with the shipped prior."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertflow import Embedder, SentenceEncoder
from bertflow.calibrators import AutoCalibrator
from bertflow.evaluation.datasets import load_sts_tasks
from bertflow.evaluation.sts import evaluate_task
from bertflow.paper.grid import GridConfig, run_grid
from bertflow.paper.perset import run_per_set

from ..conftest import DATA_DIR
from ..sts_layout import one_torch_thread, write_sts_layout  # noqa: F401 - fixture

RAW_ENCODER = DATA_DIR.parents[1] / "models" / "bert-gutenberg-L6-H384"


@pytest.fixture(scope="module")
def raw_encoder() -> SentenceEncoder:
    if not (RAW_ENCODER / "config.json").is_file():
        pytest.skip(f"raw encoder not found at {RAW_ENCODER}")
    return SentenceEncoder(str(RAW_ENCODER), pooling="first-last-avg", device="cpu")


def test_an_auto_cell_records_the_choice_embedder_fit_makes(raw_encoder: SentenceEncoder, tmp_path: Path) -> None:
    layout = write_sts_layout(tmp_path / "sts", n=40)
    task = load_sts_tasks(["STS-B"], layout)["STS-B"]
    sentences = task.fit_sentences("target")
    model = Embedder(SentenceEncoder(str(RAW_ENCODER), pooling="first-last-avg", device="cpu"), AutoCalibrator())
    model.fit(sentences)
    wanted = model.fit_info["auto"]
    assert wanted["weighting"] == "sif" and model.encoder.pooling.name == "sif:first-last-avg"  # a raw encoder

    common = dict(poolings=["first-last-avg"], calibrators=["auto"], tasks=["STS-B"], data_dir=layout, use_cache=False)
    grid = run_grid(GridConfig(regimes=["target"], **common), encoder=raw_encoder)
    (cell,) = grid.cells
    assert cell.error is None and set(cell.auto) == {"STS-B"}
    per_set = run_per_set(GridConfig(regimes=["per-set"], **common), encoder=raw_encoder)
    auto_cell = next(c for c in per_set.cells if c.calibrator == "auto")
    assert set(auto_cell.auto) == {"STS-B"}
    for got in (cell.auto["STS-B"], auto_cell.auto["STS-B"]):
        assert got["weighting"] == wanted["weighting"] and got["token_statistics"] == wanted["token_statistics"]
        # Same sentences, other batches: the statistic agrees to float32 rounding.
        assert got["token_anisotropy"] == pytest.approx(wanted["token_anisotropy"], abs=1e-3)
        assert got["calibrator"].split(" -> ")[1][:20] == wanted["calibrator"].split(" -> ")[1][:20]
    # The cell scores what the fitted model's encode gives (host float64 vs device float32 transform).
    mine = evaluate_task(task, model.encode).all_spearman
    assert cell.reports[0].tasks["STS-B"].all_spearman == pytest.approx(mine, abs=0.05)
    assert auto_cell.scores()["STS-B"] == pytest.approx(mine, abs=0.05)
    assert raw_encoder.pooling.name == "first-last-avg" and raw_encoder.token_statistics is None  # left as it was
    assert grid.to_dict()["cells"][0]["auto"]["STS-B"] == cell.auto["STS-B"]
