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

from bertflow import Embedder, EmbeddingIndex, StandardNormCalibrator
from bertflow.errors import ModelFileError, OutputError
from bertflow.io.files import (
    LOCK_NAME,
    TMP_MARK,
    atomic_directory,
    atomic_file,
    atomic_write_text,
    check_output_folder,
    folder_lock,
    folder_present,
    temporary_name,
)
from bertflow.search.sentences import index_sentences

from ..conftest import CORPUS, SENTENCES, invoke, one_line_error, snapshot
from ..safety import SRC, fit_args, loads_during_saves

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

    from bertflow.io.files import atomic_write_text

    previous = os.umask(umask)
    try:
        model = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
        folders = [model.save(tmp_path / "model", include_encoder=True)]
        folders.append(index_sentences(model, SENTENCES).save(tmp_path / "index"))
        atomic_write_text(tmp_path / "note.txt", "hello")
    finally:
        os.umask(previous)
    paths = [p for folder in folders for p in [folder, *folder.rglob("*")]] + [tmp_path / "note.txt"]
    assert len(paths) > 8
    for path in paths:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


def test_python_api_saves_follow_the_same_rule(tiny_encoder, model_a, tmp_path, monkeypatch):
    emb = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    before = snapshot(model_a)
    with pytest.raises(OutputError, match="overwrite"):
        emb.save(model_a)
    assert snapshot(model_a) == before
    emb.save(model_a, overwrite=True)
    assert Embedder.load(model_a).calibrator.name == "standard-norm"
    index = index_sentences(emb, CORPUS[:10])
    with pytest.raises(OutputError, match="bertflow model"):
        index.save(model_a, overwrite=True)
    path = index.save(tmp_path / "idx")
    with pytest.raises(OutputError, match="overwrite"):
        index.save(path)
    assert len(EmbeddingIndex.load(index.save(path, overwrite=True))) == 10
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="working directory"):
        emb.save(".", overwrite=True)


#: The calls at which a save can be killed: every file-system step of atomic_directory (and of the writes inside it).
_STEPS = (("os", "mkdir"), ("os", "rename"), ("os", "fsync"), ("os", "unlink"), ("os", "rmdir"), ("shutil", "copy2"))


def killed_save(source: Path, target: Path, step: int) -> bool:
    """Save a copy of the model folder ``source`` over ``target`` in a forked process that dies (``os._exit``: no
    cleanup, like kill -9) at its ``step``-th file-system call. False when the save finished before that step."""
    pid = os.fork()
    if pid == 0:  # the child: count the steps, die at the chosen one
        try:
            import shutil as shutil_module

            modules = {"os": os, "shutil": shutil_module}
            count = [0]
            for module, name in _STEPS:
                real = getattr(modules[module], name)

                def counted(*args, _real=real, **kwargs):
                    count[0] += 1
                    if count[0] == step:
                        os._exit(9)
                    return _real(*args, **kwargs)

                setattr(modules[module], name, counted)
            with atomic_directory(target) as tmp:
                for f in sorted(os.listdir(source)):
                    p = os.path.join(source, f)
                    (shutil_module.copytree if os.path.isdir(p) else shutil_module.copy2)(p, os.path.join(tmp, f))
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 9), status
    return os.WEXITSTATUS(status) == 9


@pytest.fixture()
def fast_loads(monkeypatch, tiny_encoder):
    """Loads read the folder's own files; the encoder (not part of the folder) is built once."""
    from bertflow import SentenceEncoder

    monkeypatch.setattr(SentenceEncoder, "from_config", classmethod(lambda cls, config, **kwargs: tiny_encoder))


@pytest.mark.parametrize("start", ["model", "left-aside"])
def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_model(model_a, model_b, tmp_path, fast_loads, start):
    """kill -9 at every step of a save over model A (or over the A that a killed save left aside): loading the path
    gives A or B complete, or one line naming the folder A was moved aside to; A is never lost, a save without
    --overwrite is still refused, and the next save with it leaves nothing beside the folder."""
    import shutil

    target = tmp_path / "model"
    aside = tmp_path / ".model.bertflow-old"
    outcomes = set()
    for step in range(1, 200):
        for p in (target, aside):
            shutil.rmtree(p, ignore_errors=True)
        shutil.copytree(model_a, target if start == "model" else aside)
        if not killed_save(model_b, target, step):
            break
        try:
            regime = Embedder.load(target).fit_info["regime"]
        except ModelFileError as e:
            message = str(e)
            assert "\n" not in message and f"previous version is in {aside}" in message, message
            assert f"mv {aside} {target}" in message
            assert not target.exists() and snapshot(aside) == snapshot(model_a)  # A is whole, beside the path
            regime = "A aside"
        else:
            assert snapshot(target) == snapshot(model_a if regime == "A" else model_b)
        outcomes.add(regime)
        with pytest.raises(OutputError, match="already holds a bertflow model"):  # A (or B) is not replaced silently
            Embedder.load(model_b).save(target)
        Embedder.load(model_b).save(target, overwrite=True)
        assert Embedder.load(target).fit_info["regime"] == "B"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model-a", "model-b"]
    else:
        pytest.fail("the save never finished")
    assert step > 10  # the loop really killed the save at many points
    assert outcomes == ({"A", "B", "A aside"} if start == "model" else {"A aside", "B"})


def test_a_save_killed_between_the_two_renames_is_one_line_for_load_and_the_cli(
    model_a, model_b, tmp_path, tiny_model_dir, corpus, fast_loads
):
    import shutil

    target = tmp_path / "model"
    shutil.copytree(model_a, target)
    step = 1
    while killed_save(model_b, target, step) and target.exists():
        shutil.rmtree(target)
        shutil.rmtree(tmp_path / ".model.bertflow-new", ignore_errors=True)
        shutil.rmtree(tmp_path / ".model.bertflow-old", ignore_errors=True)
        shutil.copytree(model_a, target)
        step += 1
    assert not target.exists() and (tmp_path / ".model.bertflow-old").is_dir()
    with pytest.raises(ModelFileError, match="rename it back"):
        Embedder.load(target)
    one_line_error(invoke(*fit_args(corpus, target, tiny_model_dir)), "moved aside to", "pass --overwrite")
    encode = invoke("encode", corpus, "-o", tmp_path / "x.npy", "--model-dir", target, "-q")
    one_line_error(encode, "previous version is in", "rename it back (mv ")
    os.rename(tmp_path / ".model.bertflow-old", target)  # what the error says to do
    assert Embedder.load(target).fit_info["regime"] == "A"


def test_leftovers_of_a_killed_save_are_removed_by_the_next_save(model_a, model_b, tmp_path):
    new, old, lock = (tmp_path / f".model-a.bertflow-{role}" for role in ("new", "old", "lock"))
    new.mkdir()
    (new / "half").write_bytes(b"partial")
    old.mkdir()
    lock.write_text("host-1\n")  # the lock file of a killed save: its OS lock went with the process
    unrelated = tmp_path / ".model-b.bertflow-new"
    unrelated.mkdir()
    Embedder.load(model_b).save(model_a, overwrite=True)
    assert Embedder.load(model_a).fit_info["regime"] == "B"
    assert not new.exists() and not old.exists() and not lock.exists() and unrelated.exists()


def test_one_save_of_a_folder_at_a_time(model_a, tmp_path):
    with atomic_directory(model_a) as tmp:
        (tmp / "x").write_text("x")
        with pytest.raises(OutputError, match="in use by another save"), atomic_directory(model_a):
            pass
    assert [p.name for p in model_a.iterdir()] == ["x"]  # the first save went through; the second never started


def test_an_interrupted_block_leaves_the_old_folder_and_no_temporary(model_a, tmp_path):
    before = snapshot(model_a)
    with pytest.raises(KeyboardInterrupt), atomic_directory(model_a) as tmp:
        (tmp / "half").write_text("x")
        raise KeyboardInterrupt
    assert snapshot(model_a) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model-a")] == []


def test_loads_during_concurrent_saves_see_one_complete_save_or_a_clear_error(
    model_a, model_b, tmp_path, tiny_encoder, monkeypatch
):
    from bertflow import SentenceEncoder

    # The encoder's weights are not part of the folder; building it once keeps each load to the folder's own
    # files, so thousands of loads race the writer (without the check, several in a thousand mixed two saves).
    monkeypatch.setattr(SentenceEncoder, "from_config", classmethod(lambda cls, config, **kwargs: tiny_encoder))

    def load(target: Path) -> str:
        emb = Embedder.load(target)
        # One complete save: config (regime) and calibrator files come from the same one.
        assert emb.calibrator.name == ("whitening" if emb.fit_info["regime"] == "A" else "standard-norm")
        return emb.fit_info["regime"]

    regimes, saves = loads_during_saves(load, model_a, model_b, tmp_path / "model")
    assert saves > 10  # the writer really replaced the folder many times meanwhile
    assert len(regimes) > 10  # and loads succeeded
    assert Embedder.load(tmp_path / "model").fit_info["regime"] in ("A", "B")


def test_folder_present_counts_a_folder_between_the_two_renames_of_a_save(tmp_path, monkeypatch):
    """The one double-check of model and index loads: a folder missing while its save is between the two renames
    counts as there (the load then names the moved-aside copy), and a folder back in place by the second look is
    found at the third."""
    target = tmp_path / "idx"
    assert not folder_present(target)
    (tmp_path / ".idx.bertflow-old").mkdir()
    assert folder_present(target)
    with pytest.raises(ModelFileError, match=r"previous version is in .*\.idx\.bertflow-old") as caught:
        EmbeddingIndex.load(target)  # not "is not a folder"
    assert "\n" not in str(caught.value)
    (tmp_path / ".idx.bertflow-old").rmdir()
    looks = iter([False, True])  # missing at the first look, in place by the time the aside is checked
    monkeypatch.setattr(Path, "is_dir", lambda self: next(looks) if self == target else Path.exists(self))
    assert folder_present(target)


def test_check_output_folder_accepts_new_and_empty_folders(tmp_path):
    assert check_output_folder(tmp_path / "new" / "deeper", "model") == (tmp_path / "new" / "deeper").resolve()
    (tmp_path / "empty").mkdir()
    assert check_output_folder(tmp_path / "empty", "index").name == "empty"
    with pytest.raises(ValueError):
        check_output_folder(tmp_path / "x", "photos")
