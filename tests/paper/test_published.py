"""The published numbers are package data keyed by task name: an eighth TaskSpec leaves them (and the report that
prints them) intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bertflow.paper.published import PAPER_TASKS, PUBLISHED, QUOTED_AVERAGES

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
model, layout = sys.argv[1], Path(sys.argv[2])
config = GridConfig(poolings=["first-last-avg"], calibrators=["none", "whitening"], regimes=["target"],
                    tasks=datasets.STS_TASKS, data_dir=layout, use_cache=False, paper_rows="bert-base-uncased")
result = run_grid(config, encoder=SentenceEncoder(model, device="cpu"))
print(json.dumps({"markdown": result.to_markdown(), "tasks": list(result.meta["tasks"]),
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
