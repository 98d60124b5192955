"""Helpers of the output-safety tests (outputs never destroy data; saves survive crashes and concurrent loads),
shared by tests/cli/, tests/io/test_files.py and tests/test_search.py; a plain module, like sts_layout.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bertflow.errors import ModelFileError

SRC = str(Path(__file__).resolve().parents[1] / "src")

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
