"""The published numbers (bertflow.paper.published) are package data keyed by task name, transcribed consistently with
the averages their sources print; an eighth TaskSpec leaves them (and the report that prints them) intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertflow.calibrators import parse_calibrator
from bertflow.evaluation.datasets import STS_TASKS
from bertflow.paper.published import (
    PAPER_TASKS,
    PUBLISHED,
    QUOTED_AVERAGES,
    matching,
    paper_model_name,
    published_for,
    stand_in_caption,
)

from ..sts_layout import working_tiny_bert, write_sts_layout  # noqa: F401 - fixture

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_rows_are_keyed_by_the_papers_tasks_and_read_from_package_data() -> None:
    from importlib import resources

    raw = json.loads(resources.files("bertflow.paper").joinpath("published.json").read_text(encoding="utf-8"))
    assert len(PUBLISHED) == len(raw["rows"]) and PAPER_TASKS == tuple(raw["paper_tasks"])
    assert all(set(r.scores) <= set(PAPER_TASKS) for r in PUBLISHED)
    for row in PUBLISHED:
        key = (row.model, row.label, row.protocol)
        if key in QUOTED_AVERAGES:
            assert abs(row.average - QUOTED_AVERAGES[key]) < 0.02, key  # type: ignore[operator]


EIGHTH = """
import json, sys
from pathlib import Path
from bertflow.evaluation import datasets
toy = datasets.TaskSpec("TOY-R", "Toy", 24, {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"})
datasets.TASK_SPECS = (*datasets.TASK_SPECS, toy)
datasets.STS_TASKS = tuple(spec.name for spec in datasets.TASK_SPECS)
from bertflow import SentenceEncoder
from bertflow.paper.grid import GridConfig, run_grid
from bertflow.paper.published import PUBLISHED
from bertflow.paper.render import render_grid
model, layout = sys.argv[1], Path(sys.argv[2])
config = GridConfig(poolings=["first-last-avg"], calibrators=["none", "whitening"], regimes=["target"],
                    tasks=datasets.STS_TASKS, data_dir=layout, use_cache=False, paper_rows="bert-base-uncased")
result = run_grid(config, encoder=SentenceEncoder(model, device="cpu"))
print(json.dumps({"markdown": render_grid(result), "tasks": list(result.meta["tasks"]),
                  "averages": [r.average for r in PUBLISHED[:2]]}))
"""


def test_an_eighth_task_spec_runs_and_renders_beside_the_published_rows(
    working_tiny_bert: Path,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    layout = write_sts_layout(tmp_path / "sts")
    toy = layout / "Toy"
    toy.mkdir()
    for split in ("train", "dev", "test"):
        (toy / f"{split}.tsv").write_text((layout / "STSBenchmark" / "train.tsv").read_text(encoding="utf-8"))
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", EIGHTH, str(working_tiny_bert), str(layout)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["tasks"][-1] == "TOY-R" and len(report["tasks"]) == 8
    assert "TOY-R" in report["markdown"] and "BERT-base-flow (target)" in report["markdown"]
    # The papers' "Avg." stays the mean of their seven tasks.
    assert report["averages"] == [PUBLISHED[0].average, PUBLISHED[1].average]


def test_published_numbers_are_transcribed_consistently() -> None:
    for row in PUBLISHED:
        assert set(row.scores) <= set(STS_TASKS) and row.protocol in ("all", "wmean")
        assert row.model in ("bert-base-uncased", "bert-large-uncased") and row.source
        for spec in row.calibrators:
            parse_calibrator(spec)
        quoted = QUOTED_AVERAGES.get((row.model, row.label, row.protocol))
        if row.average is not None:
            assert quoted is not None and abs(row.average - quoted) < 0.006, row.label
    assert len(QUOTED_AVERAGES) == sum(r.average is not None for r in PUBLISHED)
    flow_target = matching("bert-base-uncased", "first-last-avg", "flow", "target")
    assert {(r.protocol, round(r.average, 2)) for r in flow_target} == {("wmean", 69.57), ("all", 66.31)}
    # Table 5 rows (fitting corpus not stated) match any regime; raw rows only the no-fitting regime.
    assert [r.scores for r in matching("bert-base-uncased", "mean", "natsv-10", "nli")] == [{"STS-B": 60.40}]
    assert matching("bert-base-uncased", "first-last-avg", "none", "target") == []
    assert paper_model_name("google-bert/bert-base-uncased") == "bert-base-uncased"
    assert paper_model_name("/models/bert-large-uncased/") == "bert-large-uncased"
    assert paper_model_name("bert-base-cased") is None and published_for("sentence-transformers/all-MiniLM-L6-v2") == []


def test_stand_in_caption_names_the_encoder() -> None:
    caption = stand_in_caption("bert-base-uncased", "/models/bert-gutenberg-L6-H384/", 6, 384)
    assert "`bert-gutenberg-L6-H384` has 6 layers and hidden size 384" in caption and "Gutenberg" in caption
    assert "3.3B words" in caption
    with pytest.raises(ValueError, match="no published rows"):
        stand_in_caption("roberta-base", "x", 1, 2)
