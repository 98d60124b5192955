"""Issue 13, "data lost" and "tracebacks, hangs and late errors": outputs never destroy data, saves survive crashes
and concurrent loads, and every bad option or OS error is one line (exit 2) before any long work.

Each test here is a row of docs/robustness.md.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import Embedder
from bertflow.calibrators import StandardNormCalibrator, WhiteningCalibrator
from bertflow.cli import app
from bertflow.errors import ModelFileError, OutputError
from bertflow.io.files import atomic_directory, check_output_folder, folder_lock
from bertflow.search import EmbeddingIndex

from .conftest import SENTENCES, invoke, one_line_error, snapshot

runner = CliRunner()
SRC = str(Path(__file__).resolve().parents[1] / "src")
CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]


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


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "data" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def model_a(tiny_encoder, tmp_path) -> Path:
    emb = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
    emb.fit_info["regime"] = "A"
    return emb.save(tmp_path / "model-a")


@pytest.fixture()
def model_b(tiny_encoder, tmp_path) -> Path:
    emb = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    emb.fit_info["regime"] = "B"
    return emb.save(tmp_path / "model-b")


def fit_args(corpus: Path, out: Path, model_dir: Path) -> list[object]:
    return ["fit", corpus, "-o", out, "--model", model_dir, "--calibrator", "standard-norm", "-q"]


# -- -o never destroys data --------------------------------------------------------------------------------------


def test_fit_refuses_the_folder_holding_its_corpus(tiny_model_dir, corpus):
    before = snapshot(corpus.parent)
    one_line_error(invoke(*fit_args(corpus, corpus.parent, tiny_model_dir)), "holds the input")
    one_line_error(invoke(*fit_args(corpus, corpus.parent, tiny_model_dir), "--overwrite"), "holds the input")
    assert snapshot(corpus.parent) == before


def test_fit_refuses_the_working_directory(tiny_model_dir, corpus, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    for out in (".", str(work), ".."):
        one_line_error(invoke(*fit_args(corpus, out, tiny_model_dir), "--overwrite"), "working directory")
    assert (work / "notes.txt").read_text() == "mine"


def test_fit_refuses_a_foreign_folder_and_replaces_a_model_only_with_overwrite(tiny_model_dir, corpus, tmp_path):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    one_line_error(invoke(*fit_args(corpus, foreign, tiny_model_dir), "--overwrite"), "not empty", "cat.jpg")
    assert (foreign / "cat.jpg").read_bytes() == b"\xff\xd8"

    out = tmp_path / "model"
    assert invoke(*fit_args(corpus, out, tiny_model_dir)).exit_code == 0
    first = snapshot(out)
    one_line_error(invoke(*fit_args(corpus, out, tiny_model_dir)), "already holds a bertflow model", "--overwrite")
    assert snapshot(out) == first
    r = invoke(*fit_args(corpus, out, tiny_model_dir), "--overwrite")
    assert r.exit_code == 0, r.output
    assert Embedder.load(out).calibrator.name == "standard-norm"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke(*fit_args(corpus, empty, tiny_model_dir)).exit_code == 0  # an empty folder is fine


def test_search_build_refuses_to_replace_the_model(model_a, corpus, tmp_path):
    before = snapshot(model_a)
    r = invoke("search", "build", corpus, "--model-dir", model_a, "-o", model_a, "-q", "--overwrite")
    one_line_error(r, "holds the input")
    assert snapshot(model_a) == before
    # An index is not a model and a model is not an index, whatever --overwrite says.
    idx = tmp_path / "idx"
    assert invoke("search", "build", corpus, "--model-dir", model_a, "-o", idx, "-q").exit_code == 0
    one_line_error(invoke("search", "build", corpus, "--model-dir", model_a, "-o", idx, "-q"), "--overwrite")
    assert invoke("search", "build", corpus, "--model-dir", model_a, "-o", idx, "-q", "--overwrite").exit_code == 0
    one_line_error(invoke(*fit_args(corpus, idx, model_a), "--overwrite"), "search index")


def test_distributed_fit_refuses_the_store_and_foreign_folders(tiny_model_dir, corpus, tmp_path):
    store = tmp_path / "emb"
    r = invoke(*encode_store_args(corpus, store, tiny_model_dir))
    assert r.exit_code == 0, r.output
    before = snapshot(store)
    one_line_error(
        invoke("distributed-fit", store, "-o", store, "--calibrator", "whitening", "-q", "--overwrite"),
        "holds the input",
    )
    one_line_error(
        invoke("distributed-fit", store, "-o", corpus.parent, "--calibrator", "whitening", "-q"), "not empty"
    )
    assert snapshot(store) == before
    out = tmp_path / "white"
    assert invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q").exit_code == 0
    one_line_error(invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q"), "--overwrite")
    assert invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q", "--overwrite").exit_code == 0
    # distributed-encode into a model folder: not a store, refused even with --overwrite.
    one_line_error(
        invoke("distributed-encode", corpus, "-o", out, "--model", tiny_model_dir, "--overwrite"), "bertflow model"
    )


def test_python_api_saves_follow_the_same_rule(tiny_encoder, model_a, tmp_path, monkeypatch):
    emb = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    before = snapshot(model_a)
    with pytest.raises(OutputError, match="overwrite"):
        emb.save(model_a)
    assert snapshot(model_a) == before
    emb.save(model_a, overwrite=True)
    assert Embedder.load(model_a).calibrator.name == "standard-norm"
    index = EmbeddingIndex.from_sentences(emb, CORPUS[:10])
    with pytest.raises(OutputError, match="bertflow model"):
        index.save(model_a, overwrite=True)
    path = index.save(tmp_path / "idx")
    with pytest.raises(OutputError, match="overwrite"):
        index.save(path)
    assert len(EmbeddingIndex.load(index.save(path, overwrite=True))) == 10
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="working directory"):
        emb.save(".", overwrite=True)


def test_encode_refuses_to_write_over_its_input(tiny_model_dir, corpus, tmp_path):
    before = corpus.read_bytes()
    one_line_error(invoke("encode", corpus, "-o", corpus, "--model", tiny_model_dir, "-q"), "is the input")
    link = tmp_path / "link.npy"
    link.symlink_to(corpus)
    one_line_error(invoke("encode", corpus, "-o", link, "--model", tiny_model_dir, "-q"), "is the input")
    hard = tmp_path / "hard.npy"
    os.link(corpus, hard)
    one_line_error(invoke("encode", corpus, "-o", hard, "--model", tiny_model_dir, "-q"), "is the input")
    assert corpus.read_bytes() == before


# -- crashes during a save ---------------------------------------------------------------------------------------

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


def clear_race_error(e: ModelFileError) -> bool:
    """Whether a load that overlapped a save failed with one of the two lines that say so (io.files.read_folder)."""
    text = str(e)
    clear = ("replaced by another save while it was being read", "previous version is in")
    return "\n" not in text and any(c in text for c in clear)


def test_loads_during_concurrent_saves_see_one_complete_save_or_a_clear_error(
    model_a, model_b, tmp_path, tiny_encoder, monkeypatch
):
    import shutil

    from bertflow import SentenceEncoder

    # The encoder's weights are not part of the folder; building it once keeps each load to the folder's own
    # files, so thousands of loads race the writer (without the check, several in a thousand mixed two saves).
    monkeypatch.setattr(SentenceEncoder, "from_config", classmethod(lambda cls, config, **kwargs: tiny_encoder))
    target = tmp_path / "model"
    shutil.copytree(model_a, target)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER_SCRIPT.format(src=SRC), str(model_a), str(model_b), str(target), "7"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 5
    try:
        while time.monotonic() < deadline:
            try:
                emb = Embedder.load(target)
            except ModelFileError as e:
                assert clear_race_error(e), e  # never "does not match its checksum" from a mix of saves
                continue
            # One complete save: config (regime) and calibrator files come from the same one.
            expected = "whitening" if emb.fit_info["regime"] == "A" else "standard-norm"
            assert emb.calibrator.name == expected
            seen[emb.fit_info["regime"]] = seen.get(emb.fit_info["regime"], 0) + 1
    finally:
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err.decode()
    assert int(out) > 10  # the writer really replaced the folder many times meanwhile
    assert sum(seen.values()) > 10  # and loads succeeded
    assert Embedder.load(target).fit_info["regime"] in ("A", "B")


def test_index_loads_during_concurrent_saves(tiny_encoder, tmp_path):
    a = EmbeddingIndex.build(np.eye(8, dtype=np.float32)).save(tmp_path / "a")
    b = EmbeddingIndex.build(np.ones((5, 8), dtype=np.float32) + np.eye(5, 8, dtype=np.float32)).save(tmp_path / "b")
    import shutil

    target = tmp_path / "idx"
    shutil.copytree(a, target)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER_SCRIPT.format(src=SRC), str(a), str(b), str(target), "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    loads = 0
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                idx = EmbeddingIndex.load(target)
            except ModelFileError as e:
                assert clear_race_error(e), e
                continue
            assert len(idx) in (8, 5)
            loads += 1
    finally:
        writer.communicate(timeout=60)
    assert writer.returncode == 0 and loads > 0


# -- destinations checked before any work; OS errors are one line --------------------------------------------------


@pytest.fixture()
def no_model_loading(monkeypatch):
    """Fail the test if a command gets as far as loading weights."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad option was reported")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refuse)


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


def test_a_read_only_destination_fails_before_the_fit(tiny_model_dir, corpus, tmp_path, monkeypatch, no_model_loading):
    ro = tmp_path / "ro"
    ro.mkdir()
    real_open = os.open

    def read_only_fs(path, flags, *args, **kwargs):
        if str(path).startswith(str(ro)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_fs)
    one_line_error(invoke(*fit_args(corpus, ro / "model", tiny_model_dir)), "not writable", "Read-only")
    one_line_error(invoke("encode", corpus, "-o", ro / "x.npy", "--model", tiny_model_dir), "not writable")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_fails_before_the_fit(tiny_model_dir, corpus, tmp_path, no_model_loading):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        one_line_error(invoke(*fit_args(corpus, ro / "model", tiny_model_dir)), "not writable")
    finally:
        ro.chmod(0o755)


def test_disk_full_is_one_line_and_leaves_nothing(tiny_model_dir, corpus, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "x.npy"
    one_line_error(invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q"), "disk full", status=1)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".x.npy")]
    one_line_error(invoke(*fit_args(corpus, tmp_path / "m", tiny_model_dir)), "disk full", status=1)
    assert not (tmp_path / "m").exists()


def test_two_distributed_encode_runs_on_one_store(tiny_model_dir, corpus, tmp_path):
    store = tmp_path / "emb"
    store.mkdir()
    args = encode_store_args(corpus, store, tiny_model_dir)
    with folder_lock(store, "distributed-encode run"):  # another run, alive, holds the store
        one_line_error(invoke(*args), "in use", str(os.getpid()))
    (store / ".lock").write_text(f"{socket.gethostname()}-{dead_pid()}\n")  # left by a killed run
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert not (store / ".lock").exists()


def test_check_output_folder_accepts_new_and_empty_folders(tmp_path):
    assert check_output_folder(tmp_path / "new" / "deeper", "model") == (tmp_path / "new" / "deeper").resolve()
    (tmp_path / "empty").mkdir()
    assert check_output_folder(tmp_path / "empty", "index").name == "empty"
    with pytest.raises(ValueError):
        check_output_folder(tmp_path / "x", "photos")


# -- options validated before the model loads ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        pytest.param(
            ["--device", "cuda"],
            "CUDA is not available",
            id="device-cuda",
            marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA"),
        ),
        pytest.param(["--device", "bogus"], "unknown device", id="device-bogus"),
        pytest.param(["--epochs", "inf"], "epochs", id="epochs-inf"),
        pytest.param(["--epochs", "nan"], "epochs", id="epochs-nan"),
        pytest.param(["--epochs", "0"], "epochs", id="epochs-0"),
        pytest.param(["--epochs", "-1"], "epochs", id="epochs-negative"),
        pytest.param(["--max-length", "100000"], "max_length 100000", id="max-length-above-positions"),
        pytest.param(["-c", "²"], "²", id="column-superscript-two"),
        pytest.param(["--pooling", "max"], "unknown pooling", id="pooling-unknown"),
        pytest.param(["--pooling", "1,99"], "out of range", id="pooling-layer-out-of-range"),
    ],
)
def test_bad_options_are_one_line_before_loading_the_model(
    tiny_model_dir, corpus, tmp_path, options, needle, no_model_loading
):
    target = corpus
    if options[0] == "-c":
        target = tmp_path / "t.tsv"
        target.write_text("score\tsentence1\n1\tA man plays.\n", encoding="utf-8")
    one_line_error(invoke(*fit_args(target, tmp_path / "m", tiny_model_dir), *options), needle)
    assert not (tmp_path / "m").exists()


def test_invalid_utf8_on_the_command_line(tiny_model_dir, no_model_loading):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 argument
    one_line_error(invoke("similarity", bad, "fine", "--model", tiny_model_dir), "not valid UTF-8", "0xe9")
    one_line_error(invoke("search", "query", tiny_model_dir, bad), "query 1", "not valid UTF-8")


def test_devices_are_checked_before_the_ranks_start(tiny_model_dir, corpus, tmp_path):
    one_line_error(invoke("distributed-encode", corpus, "-o", tmp_path / "e", "--device", "bogus"), "unknown device")
    one_line_error(
        invoke("distributed-encode", corpus, "-o", tmp_path / "e", "--devices", "cpu,nope"), "unknown device"
    )


# -- streams: FIFO, stdin, stdout -------------------------------------------------------------------------------


def cli(*args: object, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "bertflow", *map(str, args)], input=stdin, capture_output=True, timeout=timeout, env=env
    )


def test_encode_reads_a_fifo_once(tiny_model_dir, tiny_encoder, tmp_path):
    fifo = tmp_path / "lines.fifo"
    os.mkfifo(fifo)
    lines = CORPUS[:20]

    def feed():
        with open(fifo, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    out = tmp_path / "x.npy"
    proc = cli("encode", fifo, "-o", out, "--model", tiny_model_dir, "--pooling", "mean", "-q", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr.decode()
    feeder.join(5)
    np.testing.assert_allclose(np.load(out), tiny_encoder.encode(lines), atol=1e-5)
    assert json.loads(proc.stdout)["rows"] == 20


def test_encode_stdin_to_stdout(tiny_model_dir, tiny_encoder):
    import io

    lines = CORPUS[:7]
    proc = cli(
        "encode",
        "-",
        "-o",
        "-",
        "--model",
        tiny_model_dir,
        "-q",
        "--device",
        "cpu",
        stdin=("\n".join(lines) + "\n").encode(),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    got = np.load(io.BytesIO(proc.stdout))
    assert got.shape == (7, 32)
    np.testing.assert_allclose(got, tiny_encoder.encode(lines), atol=1e-5)
    assert json.loads(proc.stderr.decode().strip().splitlines()[-1])["rows"] == 7  # the summary goes to stderr


def test_similarity_pairs_from_stdin(tiny_model_dir, tmp_path):
    tsv = "score\tsentence1\tsentence2\n" + "".join(f"{i}\t{SENTENCES[i]}\t{SENTENCES[-1 - i]}\n" for i in range(5))
    proc = cli(
        "similarity", "--pairs", "-", "-o", "-", "--model", tiny_model_dir, "--device", "cpu", stdin=tsv.encode()
    )
    assert proc.returncode == 0, proc.stderr.decode()
    rows = proc.stdout.decode().splitlines()
    assert rows[0] == "cosine\tscore\tsentence1\tsentence2" and len(rows) == 6


def test_encode_streams_a_pipe_without_reading_it_twice(tiny_model_dir):
    """``/dev/stdin`` on a pipe used to be counted, then found empty ("changed while it was being encoded")."""
    proc = cli(
        "encode",
        "/dev/stdin",
        "-o",
        "-",
        "--model",
        tiny_model_dir,
        "-q",
        "--device",
        "cpu",
        stdin=b"one line\nanother line\n",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    import io

    assert np.load(io.BytesIO(proc.stdout)).shape == (2, 32)


def test_a_blank_line_in_a_stream_is_an_error_and_no_output(tiny_model_dir, tmp_path):
    out = tmp_path / "x.npy"
    proc = cli("encode", "-", "-o", out, "--model", tiny_model_dir, "-q", "--device", "cpu", stdin=b"one\n\nthree\n")
    assert proc.returncode == 2
    assert "line 2 is blank" in proc.stderr.decode() and not out.exists()


def test_encode_help_documents_stdin_and_stdout():
    r = runner.invoke(app, ["encode", "--help"])
    text = " ".join(r.stdout.replace("│", " ").split())  # rich wraps the help column at any word
    assert "standard input" in text and "standard output" in text


@pytest.mark.parametrize("epochs", [float("inf"), float("nan"), 0, -1])
def test_the_flow_refuses_non_finite_or_non_positive_epochs(anisotropic_data, epochs):
    from bertflow.calibrators import FlowCalibrator
    from bertflow.errors import InputError

    with pytest.raises(InputError, match="epochs"):
        FlowCalibrator(epochs=epochs).fit(anisotropic_data)


def test_the_encoder_checks_device_and_max_length_before_loading_weights(tiny_model_dir, no_model_loading):
    from bertflow import SentenceEncoder
    from bertflow.errors import InputError

    with pytest.raises(InputError, match="unknown device"):
        SentenceEncoder(str(tiny_model_dir), device="bogus")
    with pytest.raises(InputError, match="at most 128"):
        SentenceEncoder(str(tiny_model_dir), max_length=129, device="cpu")


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
