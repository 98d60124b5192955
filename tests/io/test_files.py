"""bertflow.io.files. Atomic file writes: a reader sees the old file or the whole new one; a failed write leaves
nothing behind. folder_lock (issue 25 item 7: the ``filelock`` package instead of a home-made lock): one run per
folder, the holder named in the refusal, and the lock of a killed process free again at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertflow import (
    Embedder,
    StandardNormCalibrator,
)
from bertflow.errors import OutputError
from bertflow.io.files import LOCK_NAME, TMP_MARK, atomic_file, atomic_write_text, folder_lock, temporary_name
from bertflow.search import EmbeddingIndex

from ..conftest import SENTENCES
from ..test_embedder import CORPUS

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


def test_atomic_file_replaces_on_success(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old", encoding="utf-8")
    with atomic_file(target, "w", encoding="utf-8") as fh:
        fh.write("new")
        assert target.read_text(encoding="utf-8") == "old"  # nothing visible before the block ends
        assert temporary_name(target).exists()
    assert target.read_text(encoding="utf-8") == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_file_keeps_the_old_file_on_error(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half way"), atomic_file(target, "wb") as fh:
        fh.write(b"partial")
        raise RuntimeError("half way")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "new.bin", "wb"):
        raise KeyboardInterrupt  # interrupted: no new file, no temporary one
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_temporary_name_is_hidden_and_marked(tmp_path):
    name = temporary_name(tmp_path / "shard.npy").name
    assert name.startswith(".shard.npy" + TMP_MARK)


def test_atomic_write_text_is_utf8(tmp_path):
    target = tmp_path / "note.json"
    atomic_write_text(target, "naïve ✓")
    assert target.read_bytes() == "naïve ✓".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["note.json"]


def test_read_folder_names_a_save_that_replaced_the_folder_during_the_read(tmp_path):
    from bertflow.errors import ModelFileError
    from bertflow.io.files import atomic_directory, read_folder

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a").write_text("1")

    def read_while_saved_over(f):
        first = (f / "a").read_text()
        with atomic_directory(f) as tmp:  # another process's save, between two reads of this one
            (tmp / "a").write_text("2")
        return first, (f / "a").read_text()

    with pytest.raises(ModelFileError, match="replaced by another save while it was being read; load it again"):
        read_folder(folder, read_while_saved_over)  # ("1", "2") would mix two saves
    assert read_folder(folder, lambda f: (f / "a").read_text()) == "2"

    def broken(f):
        raise ModelFileError("its own error")

    with pytest.raises(ModelFileError, match="its own error"):  # nothing changed: the folder's own error, as is
        read_folder(folder, broken)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_model_and_index_follow_the_umask(tiny_encoder, tmp_path, umask):
    import os
    import stat

    from bertflow.io.files import atomic_write_text, current_umask

    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        model = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
        folders = [model.save(tmp_path / "model", include_encoder=True)]
        folders.append(EmbeddingIndex.from_sentences(model, SENTENCES).save(tmp_path / "index"))
        atomic_write_text(tmp_path / "note.txt", "hello")
    finally:
        os.umask(previous)
    paths = [p for folder in folders for p in [folder, *folder.rglob("*")]] + [tmp_path / "note.txt"]
    assert len(paths) > 8
    for path in paths:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
