"""The application's own rules (``bertflow.cli._app``): usage errors and runtime errors exit with different
statuses (issue 25 item 7), each one line on stderr, never a traceback; a reader that closes the pipe early (``|
head``) ends the command quietly; ``--version``."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from bertflow import Embedder
from bertflow.cli import EXIT_BROKEN_PIPE, EXIT_RUNTIME, EXIT_USAGE, app
from bertflow.errors import DivergenceError

from ..conftest import invoke, one_line_error
from ..safety import SRC

runner = CliRunner()


def test_usage_and_runtime_errors_have_their_own_exit_status(tiny_model_dir, corpus, tmp_path, monkeypatch):
    assert (EXIT_USAGE, EXIT_RUNTIME) == (2, 1)
    r = runner.invoke(app, ["fit", str(corpus), "-o", str(tmp_path / "m"), "--no-such-option"])
    one_line_error(r, "No such option", "--no-such-option", "bertflow fit --help")  # typer's own usage error
    r = runner.invoke(app, ["fit", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "m")])
    one_line_error(r, "missing.txt", "no such file")  # a wrong input: the command is wrong
    model = ["--model", str(tiny_model_dir), "-q"]

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:  # the system failed the run: a runtime error, one line
        m.setattr(os, "fsync", full)
        r = runner.invoke(app, ["encode", str(corpus), "-o", str(tmp_path / "x.npy"), *model])
    assert r.exit_code == EXIT_RUNTIME and r.stderr.count("\n") == 1 and "disk full" in r.stderr, r.stderr

    def diverge(self, *args, **kwargs):
        raise DivergenceError("the flow diverged at step 3 of 4")

    monkeypatch.setattr(Embedder, "fit", diverge)
    r = runner.invoke(app, ["fit", str(corpus), "-o", str(tmp_path / "m"), *model])
    assert r.exit_code == EXIT_RUNTIME and r.stderr == "bertflow: error: the flow diverged at step 3 of 4\n"


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(tiny_model_dir, tmp_path):
    lines = "\n".join(f"sentence number {i} of many" for i in range(3000)) + "\n"
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "bertflow", "encode", "-", "-o", "-", "--model", str(tiny_model_dir), "-q"]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdin.write(lines.encode())
    proc.stdin.close()
    assert proc.stdout.read(16).startswith(b"\x93NUMPY")  # `| head -c 16`: read a little, then close the pipe
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == EXIT_BROKEN_PIPE
    assert stderr == "", stderr  # no traceback, no "Exception ignored", no error line


def test_version():
    from bertflow import __version__

    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"bertflow {__version__}"


def test_user_errors_exit_2(tiny_model_dir, tmp_path, corpus):
    r = invoke("similarity", "only one", "--model", tiny_model_dir)
    assert r.exit_code == 2 and "exactly two" in r.stderr
    r = invoke("fit", corpus, "-o", tmp_path / "m", "--model", tiny_model_dir, "--pooling", "max")
    assert r.exit_code == 2 and "unknown pooling" in r.stderr
    r = invoke("encode", corpus, "-o", tmp_path / "x.npy", "--model-dir", tmp_path / "missing")
    assert r.exit_code == 2
