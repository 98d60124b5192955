"""benchmarks/bench.py, the benchmarks' command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import harness
import pytest

from .conftest import BENCHMARKS


def bench_main(*args: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``benchmarks/bench.py ARGS`` in this process (so the harness can be patched): (status, stdout, stderr)."""
    spec = importlib.util.spec_from_file_location("bertflow_benchmarks_bench", BENCHMARKS / "bench.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capsys.readouterr()
    status = script.main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture
def fake_flow_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(X, *, device, probe_steps, full_epoch, log):  # noqa: ANN001, ANN202 - bench_flow_fit_gpu's signature
        log("[flow fit] a progress line")
        return {"rows": len(X)}

    monkeypatch.setattr(harness, "bench_flow_fit_gpu", fake)


def test_bench_quiet(tmp_path, fake_flow_fit, capsys):
    """-q silences the benchmarks' lines (the numbers still go to --json) and needs --json."""
    args = ("flow", "--rows", "8", "--dim", "4", "--device", "cpu")
    status, out, _ = bench_main(*args, "--json", tmp_path / "a.json", capsys=capsys)
    assert status == 0 and "a progress line" in out
    status, out, _ = bench_main(*args, "--json", tmp_path / "b.json", "-q", capsys=capsys)
    assert status == 0 and out == ""
    assert json.loads((tmp_path / "b.json").read_text())["flow_fit"] == {"rows": 8}
    status, _, err = bench_main(*args, "-q", capsys=capsys)
    assert status == 2 and "add --json" in err


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
