"""benchmarks/flow_study.py and benchmarks/grid_tables.py on the tiny BERT and the synthetic STS layout: the
tables they print are the numbers of the runs they read, not anything else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from bertflow import SentenceEncoder
from bertflow.paper.grid import GridConfig, run_grid

from ..sts_layout import one_torch_thread, working_tiny_bert, write_sts_layout  # noqa: F401 - fixtures

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sts_layout(tmp_path_factory.mktemp("sts-study"), n=30)


def test_flow_study_rows_are_the_grid_cells(
    working_tiny_bert: Path,  # noqa: F811
    layout: Path,
    tmp_path: Path,
) -> None:
    study = _load("flow_study")
    out = tmp_path / "study"
    study.main(["--model", str(working_tiny_bert), "--data-dir", str(layout), "--settings", "code,lr-1e-2",
                "--seeds", "2", "--output", str(out), "--quiet"])  # fmt: skip
    data = json.loads(out.with_suffix(".json").read_text())
    rows = data["rows"]["first-last-avg"]
    enc = SentenceEncoder(str(working_tiny_bert), device="cpu")
    k = round(enc.dim / 3)  # whitening-K with the project's K = D/3 for dimensions other than 768 and 1024
    assert list(rows) == ["raw", "whitening", f"whitening-{k}", "code", "lr-1e-2"]
    assert rows["code"]["seeds"] == [0, 1] and rows["code"]["all"]["std"] is not None
    assert data["meta"]["settings"]["lr-1e-2"]["options"] == {"lr": 0.01}
    # The code setting is exactly what the grid gives for the official flow with the same seeds.
    grid = run_grid(
        GridConfig(
            poolings=["first-last-avg"],
            calibrators=["flow"],
            regimes=["target"],
            seeds=2,
            data_dir=layout,
            use_cache=False,
        ),  # fmt: skip
        encoder=enc,
    )
    assert rows["code"]["all"] == grid.cells[0].average_stat("all")
    md = out.with_suffix(".md").read_text()
    best = max(("whitening", f"whitening-{k}"), key=lambda k: rows[k]["all"]["mean"])
    gap = rows["code"]["all"]["mean"] - rows[best]["all"]["mean"]
    line = next(x for x in md.splitlines() if x.startswith("| code |"))
    assert f"{gap:+.2f}" in line and "±" in line
    assert "Best flow setting" in md and "test sentences seen while fitting | yes" in md


def test_flow_study_refuses_unknown_settings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _load("flow_study").main(["--settings", "code,epochs-99", "--output", "x"])
    assert exc.value.code == 2 and "epochs-99" in capsys.readouterr().err


def test_grid_tables_pivot_the_report(working_tiny_bert: Path, layout: Path) -> None:  # noqa: F811
    enc = SentenceEncoder(str(working_tiny_bert), device="cpu")
    result = run_grid(
        GridConfig(
            poolings=["mean"],
            calibrators=["none", "standard-norm", "whitening"],
            regimes=["target", "train"],
            data_dir=layout,
            use_cache=False,
        ),  # fmt: skip
        encoder=enc,
    )
    report = json.loads(json.dumps(result.to_dict()))
    tables = _load("grid_tables")
    text = tables.tables([report])
    cells = {(c.calibrator, c.regime): c for c in result.cells}
    row = next(x for x in text.splitlines() if x.startswith("| mean | target |"))
    assert f"| {cells['none', 'none'].average_stat('all')['mean']:.2f} |" in row
    assert f"{cells['whitening', 'target'].average_stat('all')['mean']:.2f}" in row
    assert "| mean | train |" not in text  # no 7-task average without STS12-16
    two = tables.two_task_table([report])
    assert "| mean | whitening | train |" in two
