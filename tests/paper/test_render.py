"""The Markdown reports (bertflow.paper.render): the papers' rows printed beside a grid on their model."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import shutil
from pathlib import Path

from bertflow import SentenceEncoder
from bertflow.paper.grid import GridConfig, run_grid
from bertflow.paper.published import published_for
from bertflow.paper.render import render_grid

from ..sts_layout import layout, one_torch_thread, working_tiny_bert  # noqa: F401 - fixtures


def test_paper_rows_printed_beside_bert_base(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:
    # A folder named like the paper's model: reproduce must show the published rows beside ours.
    folder = tmp_path / "bert-base-uncased"
    shutil.copytree(working_tiny_bert, folder)
    enc = SentenceEncoder(str(folder), device="cpu")
    result = run_grid(
        GridConfig(poolings=["first-last-avg"], calibrators=["none"], regimes=[], data_dir=layout, use_cache=False),
        encoder=enc,
    )
    md = render_grid(result)
    assert "## Published numbers for bert-base-uncased" in md
    assert "69.57" in md and "66.31" in md  # flow (target) under wmean and all
    raw_row = next(line for line in md.splitlines() if line.startswith("| first-last-avg | none | none |"))
    assert "63.69 (wmean" in raw_row and "60.73 (all" in raw_row
    assert len(result.to_dict()["published"]) == len(published_for("bert-base-uncased"))
