"""Rules every `bertflow` command follows: usage errors and runtime errors exit with different statuses (issue 25
item 7); a reader that closes the pipe early (``| head``) ends the command quietly; ``--version``, ``-q`` and
``--threads``; unwritable destinations, bad bytes on the command line and options a model folder fixes are one line
before any work; the first status line comes before the model loads. (``-`` as standard input: tests/cli/test_fit.py,
test_search.py, test_encode.py.)"""

from __future__ import annotations

import errno
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

from ..conftest import CORPUS, invoke, one_line_error
from ..safety import SRC, fit_args

runner = CliRunner()


def cli(*args: object, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, "-m", "bertflow", *map(str, args)]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=300, env=env, cwd=cwd)


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


def test_encode_and_similarity_refuse_to_replace_a_file_bertflow_did_not_write(tiny_model_dir, corpus, tmp_path):
    notes = tmp_path / "notes.npy"
    notes.write_text("my notes", encoding="utf-8")
    one_line_error(invoke("encode", corpus, "-o", notes, "--model", tiny_model_dir, "-q"), "--overwrite", "notes.npy")
    assert notes.read_text(encoding="utf-8") == "my notes"
    # A matrix saved by numpy is not bertflow's output either (its header is numpy's 128 bytes, not bertflow's).
    mine = tmp_path / "mine.npy"
    np.save(mine, np.ones((3, 4), dtype=np.float32))
    one_line_error(invoke("encode", corpus, "-o", mine, "--model", tiny_model_dir, "-q"), "--overwrite")
    assert np.array_equal(np.load(mine), np.ones((3, 4), dtype=np.float32))

    out = tmp_path / "vectors.npy"
    assert invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q").exit_code == 0
    first = np.load(out)
    assert first.shape[0] == len(CORPUS)
    assert invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q").exit_code == 0  # its own: replaced
    assert np.array_equal(np.load(out), first)
    assert invoke("encode", corpus, "-o", notes, "--model", tiny_model_dir, "-q", "--overwrite").exit_code == 0
    assert np.array_equal(np.load(notes), first)

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t1\n" for a, b in zip(CORPUS, CORPUS[3:])))
    diary = tmp_path / "diary.tsv"
    diary.write_text("date\tentry\n2026-01-01\tnew year\n", encoding="utf-8")
    args = ["similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q", "-o"]
    one_line_error(invoke(*args, diary), "--overwrite", "diary.tsv")
    assert diary.read_text(encoding="utf-8") == "date\tentry\n2026-01-01\tnew year\n"
    scores = tmp_path / "scores.tsv"
    assert invoke(*args, scores).exit_code == 0
    assert invoke(*args, scores).exit_code == 0  # its own output: replaced
    assert invoke(*args, diary, "--overwrite").exit_code == 0
    assert diary.read_text(encoding="utf-8") == scores.read_text(encoding="utf-8")


@pytest.mark.parametrize("command", ["similarity", "encode"])
def test_the_first_status_line_comes_before_the_model_loads(command, tiny_model_dir, tmp_path, monkeypatch):
    """Item 10: ``bertflow: loading MODEL ...`` on a terminal's stderr before torch and the weights load (16 s of
    silence before); none with -q, none on a pipe (stderr keeps its one-line error)."""
    from bertflow.cli import core, options
    from bertflow.errors import InputError

    def loader(*args, **kwargs):
        raise InputError("the loader ran")

    monkeypatch.setattr(core, "build_encoder", loader)
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: True)
    text = tmp_path / "in.txt"
    text.write_text("A man plays a guitar.\n")
    args = {
        "similarity": ["similarity", "One sentence.", "Another one.", "-m", tiny_model_dir],
        "encode": ["encode", text, "-o", tmp_path / "out.npy", "-m", tiny_model_dir],
    }[command]
    lines = invoke(*args).stderr.splitlines()
    assert lines == [f"bertflow: loading {tiny_model_dir} ...", "bertflow: error: the loader ran"]
    assert invoke(*args, "-q").stderr.splitlines() == ["bertflow: error: the loader ran"]
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: False)
    assert invoke(*args).stderr.splitlines() == ["bertflow: error: the loader ran"]


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


def test_every_command_has_quiet_and_the_encoding_ones_threads():
    """The README promises -q on every command; --threads goes with every command that encodes sentences."""
    import typer

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), {opt for p in command.params for opt in getattr(p, "opts", [])}

    commands = dict(walk(typer.main.get_command(app), []))
    assert len(commands) >= 11
    assert [name for name, opts in commands.items() if "-q" not in opts or "--quiet" not in opts] == []
    for name in ("fit", "encode", "similarity", "search build", "search query", "evaluate", "reproduce", "analyze"):
        assert "--threads" in commands[name], name


def test_unwritable_destinations_fail_before_any_work(tiny_model_dir, corpus, tmp_path, no_model_loading):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    one_line_error(invoke(*fit_args(corpus, blocker / "model", tiny_model_dir)), "is not a folder")
    one_line_error(invoke(*fit_args(corpus, blocker, tiny_model_dir)), "not a folder")
    one_line_error(
        invoke("encode", corpus, "-o", tmp_path / "missing" / "x.npy", "--model", tiny_model_dir), "does not exist"
    )
    one_line_error(invoke("encode", corpus, "-o", tmp_path, "--model", tiny_model_dir), "is a folder")
    one_line_error(
        invoke("search", "build", corpus, "--model-dir", tmp_path / "m", "-o", blocker / "i"), "is not a folder"
    )
    # Report folders (evaluate, reproduce, analyze) are checked before the evaluation runs.
    one_line_error(invoke("evaluate", "--model", tiny_model_dir, "-o", blocker), "not a folder")
    one_line_error(invoke("reproduce", "--model", tiny_model_dir, "-o", blocker / "r"), "is not a folder")
    one_line_error(invoke("analyze", "--model", tiny_model_dir, "-o", blocker / "r"), "is not a folder")


def test_invalid_utf8_on_the_command_line(tiny_model_dir, no_model_loading):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 argument
    one_line_error(invoke("similarity", bad, "fine", "--model", tiny_model_dir), "not valid UTF-8", "0xe9")
    one_line_error(invoke("search", "query", tiny_model_dir, bad), "query 1", "not valid UTF-8")


@pytest.mark.parametrize(
    "argv",
    [
        ["encode", "IN", "-o", "OUT.npy", "--pooling", "cls"],
        ["encode", "IN", "-o", "OUT.npy", "--max-length", "32"],
        ["similarity", "a b", "c d", "--model", "other"],
        ["evaluate", "--calibrator", "whitening"],
        ["analyze", "--pooling", "cls", "-o", "OUT"],
    ],
    ids=["encode-pooling", "encode-max-length", "similarity-model", "evaluate-calibrator", "analyze-pooling"],
)
def test_options_a_model_folder_fixes_are_refused_with_model_dir(argv, tmp_path, no_model_loading):
    """--pooling, --max-length, --model (and the fitting options) would be silently ignored with --model-dir."""
    corpus = tmp_path / "in.txt"
    corpus.write_text("a sentence\n", encoding="utf-8")
    argv = [str(corpus) if a == "IN" else str(tmp_path / a) if a.startswith("OUT") else a for a in argv]
    one_line_error(invoke(*argv, "--model-dir", tmp_path / "some-model"), "cannot be combined with --model-dir")
    assert not (tmp_path / "OUT.npy").exists()
