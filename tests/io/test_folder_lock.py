"""folder_lock (issue 25 item 7: the ``filelock`` package instead of a home-made lock): one run per folder, the
holder named in the refusal, and the lock of a killed process free again at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertflow.errors import OutputError
from bertflow.io.files import LOCK_NAME, folder_lock

SRC = str(Path(__file__).resolve().parents[2] / "src")
HOLD = "import sys, time; from bertflow.io.files import folder_lock\n" \
       "with folder_lock(sys.argv[1], 'test run'):\n    print('held', flush=True); time.sleep(120)\n"  # fmt: skip


def test_one_holder_at_a_time_and_a_killed_holder_frees_it(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(OutputError, match=rf"in use by another distributed-encode run \(process \S+-{child.pid},"):
            with folder_lock(tmp_path, "distributed-encode run"):
                pass
    finally:
        child.send_signal(signal.SIGKILL)  # killed: no cleanup runs, its lock file stays behind
        child.wait(timeout=30)
    assert (tmp_path / LOCK_NAME).exists()
    started = time.monotonic()
    with folder_lock(tmp_path, "distributed-encode run"):  # free at once: the OS dropped the dead process's lock
        assert str(os.getpid()) in (tmp_path / LOCK_NAME).read_text()
        with pytest.raises(OutputError, match="in use"):  # a second holder in this very process is refused too
            with folder_lock(tmp_path, "distributed-encode run"):
                pass
    assert time.monotonic() - started < 5 and not (tmp_path / LOCK_NAME).exists()
