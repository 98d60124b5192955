"""benchmarks/bench.py (the benchmarks' command line) and the deprecated ``bertflow bench`` that runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import harness
import pytest

from bertflow.cli import bench as cli_bench

from ..test_cli import invoke
from .conftest import BENCHMARKS


@pytest.fixture
def fake_flow_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(X, *, device, probe_steps, full_epoch, log):  # noqa: ANN001, ANN202 - bench_flow_fit_gpu's signature
        log("[flow fit] a progress line")
        return {"rows": len(X)}

    monkeypatch.setattr(harness, "bench_flow_fit_gpu", fake)


def test_bench_quiet(tmp_path, fake_flow_fit):
    """-q silences the benchmarks' lines (the numbers still go to --json) and needs --json."""
    args = ("bench", "flow", "--rows", "8", "--dim", "4", "--device", "cpu")
    r = invoke(*args, "--json", tmp_path / "a.json")
    assert r.exit_code == 0 and "a progress line" in r.stdout
    r = invoke(*args, "--json", tmp_path / "b.json", "-q")
    assert r.exit_code == 0 and r.stdout == ""
    assert json.loads((tmp_path / "b.json").read_text())["flow_fit"] == {"rows": 8}
    r = invoke(*args, "-q")
    assert r.exit_code == 2 and "add --json" in r.stderr


def test_bertflow_bench_says_it_is_deprecated_and_names_the_script(tmp_path, fake_flow_fit):
    r = invoke("bench", "flow", "--rows", "8", "--dim", "4", "--device", "cpu", "--json", tmp_path / "a.json")
    assert r.exit_code == 0
    first = r.stderr.splitlines()[0]
    assert first.startswith("bertflow bench is deprecated: run python benchmarks/bench.py flow --rows 8")
    assert json.loads((tmp_path / "a.json").read_text())["flow_fit"] == {"rows": 8}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["flow", "--nonsense"], "unrecognized arguments: --nonsense"),
        ([], "required: {cpu,flow,suite}"),
        (["suite", "--tokenizer-dir", "tok", "--device", "cpu", "--scale", "huge"], "unknown scale 'huge'"),
    ],
)
def test_bertflow_bench_bad_options_are_one_error_line_before_the_notice(args, message):
    r = invoke("bench", *args)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("bertflow: error: ")
    assert message in r.stderr


def test_bertflow_bench_without_the_checkout_is_one_line(monkeypatch, tmp_path):
    """An installed wheel has no benchmarks/ folder: one line naming the script to run, exit status 2."""
    monkeypatch.setattr(cli_bench, "SCRIPT", tmp_path / "benchmarks" / "bench.py")
    r = invoke("bench", "cpu", "--rounds", "3")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        "bertflow: error: bertflow bench moved out of the package: run python benchmarks/bench.py cpu --rounds 3 "
        "from a source checkout of bertflow"
    ]


def test_bench_script_refuses_bad_options_in_one_line(tmp_path):
    """Run as a script (its own process): a bad option is one line on stderr and exit status 2, before any timing."""
    for args, message in (
        (["flow", "-q"], "add --json FILE"),
        (["flow", "--nonsense"], "unrecognized arguments"),
        (["flow", "--device", "nonsense"], "unknown device"),
        (["flow", "--device", "cpu", "--json", str(tmp_path / "missing" / "x.json")], "not exist"),
    ):
        r = subprocess.run([sys.executable, str(BENCHMARKS / "bench.py"), *args], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bench.py: error: ") and message in lines[0], lines
