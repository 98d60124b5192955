"""Unix conventions of the `bertflow` command (issue 25 item 7): ``-`` is standard input for ``fit``, ``search
build`` and ``search query``; a reader that closes the pipe early (``| head``) ends the command quietly; usage errors
and runtime errors exit with different statuses."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import Embedder
from bertflow.cli import EXIT_BROKEN_PIPE, EXIT_RUNTIME, EXIT_USAGE, app
from bertflow.errors import DivergenceError

from ..conftest import SENTENCES

SRC = str(Path(__file__).resolve().parents[2] / "src")
CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]
runner = CliRunner()


def cli(*args: object, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, "-m", "bertflow", *map(str, args)]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=300, env=env, cwd=cwd)


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


def test_usage_and_runtime_errors_have_their_own_exit_status(tiny_model_dir, corpus, tmp_path, monkeypatch):
    assert (EXIT_USAGE, EXIT_RUNTIME) == (2, 1)
    r = runner.invoke(app, ["fit", str(corpus), "-o", str(tmp_path / "m"), "--no-such-option"])
    assert r.exit_code == EXIT_USAGE  # click's own usage error
    r = runner.invoke(app, ["fit", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "m")])
    assert r.exit_code == EXIT_USAGE and "no such file" in r.stderr  # a wrong input: the command is wrong
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
def test_fit_reads_standard_input(tiny_model_dir, corpus, tmp_path):
    proc = cli("fit", "-", "-o", tmp_path / "m", "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q",
               stdin=corpus.read_bytes())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.decode().splitlines()[-1])["sentences"] == len(CORPUS)
    from_file = runner.invoke(
        app, ["fit", str(corpus), "-o", str(tmp_path / "f"), "--model", str(tiny_model_dir), "--calibrator",
              "standard-norm", "-q"]
    )  # fmt: skip
    assert from_file.exit_code == 0
    # The same fit (two processes, whose thread counts may differ: float32 sums in another order, 1e-7 apart).
    np.testing.assert_allclose(Embedder.load(tmp_path / "m").encode(CORPUS[:5]),
                               Embedder.load(tmp_path / "f").encode(CORPUS[:5]), atol=1e-5)  # fmt: skip
    assert Embedder.load(tmp_path / "m").fit_info["regime"] == "corpus <stdin>"


@pytest.mark.slow
def test_search_build_and_query_read_standard_input(tiny_encoder, corpus, tmp_path):
    from bertflow import WhiteningCalibrator

    model = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(CORPUS).save(tmp_path / "model")
    proc = cli("search", "build", "-", "--model-dir", model, "-o", tmp_path / "idx", "-q", stdin=corpus.read_bytes())
    assert proc.returncode == 0, proc.stderr
    queries = f"{CORPUS[3]}\n{CORPUS[40]}\n".encode()
    proc = cli("search", "query", tmp_path / "idx", "-", "--json", "-k", "1", stdin=queries)
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [a["query"] for a in answers] == [CORPUS[3], CORPUS[40]]
    assert [a["hits"][0]["id"] for a in answers] == [4, 41]  # ids are 1-based line numbers of the stdin corpus
    r = runner.invoke(app, ["search", "query", str(tmp_path / "idx"), "-", "-"])
    assert r.exit_code == EXIT_USAGE and "may be given once" in r.stderr


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
