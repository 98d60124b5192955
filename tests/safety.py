"""Helpers of the output-safety tests (outputs never destroy data; saves survive crashes and concurrent loads),
shared by tests/cli/, tests/io/test_files.py and tests/test_search.py; a plain module, like sts_layout.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bertflow.errors import ModelFileError

SRC = str(Path(__file__).resolve().parents[1] / "src")
T = TypeVar("T")

#: A writer process: saves one of two folders into a target over and over for some seconds (the concurrent-load tests).
_WRITER_SCRIPT = """
import os, random, shutil, sys, time
sys.path.insert(0, {src!r})
from bertflow.io.files import atomic_directory
sources, target, seconds = sys.argv[1:3], sys.argv[3], float(sys.argv[4])
end, i = time.monotonic() + seconds, 0
while time.monotonic() < end:
    with atomic_directory(target) as tmp:
        src = sources[i % 2]
        for f in os.listdir(src):
            p = os.path.join(src, f)
            (shutil.copytree if os.path.isdir(p) else shutil.copy2)(p, os.path.join(tmp, f))
    i += 1
    time.sleep(random.uniform(0, 0.05))
print(i)
"""


def encode_store_args(corpus: Path, store: Path, model: Path) -> list[object]:
    """`bertflow distributed-encode` of ``corpus`` into ``store`` as one small, quiet, single-process run."""
    return [
        "distributed-encode",
        corpus,
        "-o",
        store,
        "--model",
        model,
        "-q",
        "--chunk-size",
        "16",
        "--shard-size",
        "32",
    ]


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def fit_args(corpus: Path, out: Path, model_dir: Path) -> list[object]:
    return ["fit", corpus, "-o", out, "--model", model_dir, "--calibrator", "standard-norm", "-q"]


def clear_race_error(e: ModelFileError) -> bool:
    """Whether a load that overlapped a save failed with one of the two lines that say so (io.files.read_folder)."""
    text = str(e)
    clear = ("replaced by another save while it was being read", "previous version is in")
    return "\n" not in text and any(c in text for c in clear)


def loads_during_saves(
    load: Callable[[Path], T], a: Path, b: Path, target: Path, seconds: float = 5
) -> tuple[list[T], int]:
    """Copy the folder ``a`` to ``target``, then call ``load(target)`` for ``seconds`` while a writer process saves
    ``a`` and ``b`` into ``target`` in turn: every load returns, or fails with one of the clear lines
    (:func:`clear_race_error`; never a checksum error from a mix of two saves). Returns what the loads that succeeded
    returned, and how many saves the writer made (it runs 2 s longer than the loads)."""
    shutil.copytree(a, target)
    script = _WRITER_SCRIPT.format(src=SRC)
    command = [sys.executable, "-c", script, str(a), str(b), str(target), str(seconds + 2)]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results: list[T] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                results.append(load(target))
            except ModelFileError as e:
                assert clear_race_error(e), e
    finally:
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err.decode()
    return results, int(out)
