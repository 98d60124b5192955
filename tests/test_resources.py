"""bertflow.resources: usable cores, thread limits that are restored, the machine record of reports."""

from __future__ import annotations

import os

import pytest
import torch
from threadpoolctl import threadpool_info

from bertflow import resources


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_counted_setting_is_restored_when_the_last_holder_leaves():
    """Two overlapping holders (concurrent encodes): the first to leave does not restore the setting under the
    other, in either order; the last one does."""
    value = ["saved"]
    setting = resources.CountedSetting(lambda: value[0], lambda v: value.__setitem__(0, v))
    setting.hold("fast")
    setting.hold("fast")
    setting.release()
    assert value == ["fast"]
    setting.release()
    assert value == ["saved"]
    with setting.held("a"):
        setting.hold("b")  # a later holder only counts
        assert value == ["a"]
    assert value == ["a"]
    setting.release()
    assert value == ["saved"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_counted_setting_is_put_back_in_a_child_forked_while_held():
    """A child forked while a thread holds the setting has no such thread: the saved value is back, nobody holds it."""
    value = ["saved"]
    setting = resources.CountedSetting(lambda: value[0], lambda v: value.__setitem__(0, v))
    with setting.held("paused"):
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if the value was put back and a new holder works
            ok = value == ["saved"]
            with setting.held("again"):
                ok = ok and value == ["again"]
            os._exit(0 if ok and value == ["saved"] else 1)
        assert value == ["paused"]  # the parent still holds it
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert value == ["saved"]


def test_usable_cpus_is_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert resources.usable_cpus() == 3
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows: every core
    assert resources.usable_cpus() == (os.cpu_count() or 1)


def test_limited_threads_limits_and_restores_torch_and_blas() -> None:
    before_torch, before_blas = torch.get_num_threads(), _blas_threads()
    assert before_blas  # numpy's BLAS is loaded, so there is something to limit
    target = 2 if before_torch == 1 else 1
    with resources.limited_threads(torch_threads=target, blas_threads=1):
        assert torch.get_num_threads() == target and all(n == 1 for n in _blas_threads())
    assert torch.get_num_threads() == before_torch and _blas_threads() == before_blas
    with resources.limited_threads():  # None: nothing changes
        assert torch.get_num_threads() == before_torch and _blas_threads() == before_blas
    with pytest.raises(RuntimeError), resources.limited_threads(torch_threads=target):
        raise RuntimeError("the limit is restored on the way out of an error too")
    assert torch.get_num_threads() == before_torch


def test_set_torch_threads_returns_the_previous_count_and_floors_at_one() -> None:
    before = torch.get_num_threads()
    try:
        assert resources.set_torch_threads(0) == before and torch.get_num_threads() == 1
        assert resources.set_torch_threads(before) == 1
    finally:
        torch.set_num_threads(before)


def test_machine_info_names_the_machine() -> None:
    info = resources.machine_info("cpu")
    assert info["device"] == "cpu" and info["usable_cpus"] == resources.usable_cpus() >= 1
    assert info["torch"] == torch.__version__ and "gpu" not in info


def _glibc():  # noqa: ANN202
    """glibc as a ctypes library with ``malloc``/``free``/``memset`` typed, or None off glibc."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return libc


def _resident_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _leave_a_heap_hole(libc, megabytes: int = 200) -> int:  # noqa: ANN001
    """Free ``megabytes`` of touched heap memory that glibc keeps resident, as freed activations were (issue 24,
    item 9); return the address of the block that pins it (to free afterwards).

    A freed 24 MB mapping raises glibc's dynamic mmap threshold, so the 2 MB blocks after it come from the heap;
    the block allocated last sits above them, so their space cannot be trimmed off the heap's top when freed.
    """
    libc.free(libc.malloc(24 << 20))
    blocks = [libc.malloc(2 << 20) for _ in range(megabytes // 2)]
    for b in blocks:
        libc.memset(b, 1, 2 << 20)
    pin = libc.malloc(1 << 20)
    libc.memset(pin, 1, 1 << 20)
    for b in blocks:
        libc.free(b)
    return pin


def _trim_check(model_dir: str | None) -> None:
    """Body of the next two tests, run in a fresh process: there the block that pins the hole sits at the heap's
    top (in a long test process earlier tests leave free space elsewhere, where the pin may land, and glibc then
    trims the freed blocks off the top by itself, so the outcome depended on test order).

    Leaves a 200 MB hole in the heap, then returns freed memory: directly (``model_dir`` None) or through a CPU
    encode of a model at ``model_dir``; the hole must no longer be resident.
    """
    libc = _glibc()
    encoder = None
    if model_dir is not None:
        from bertflow import SentenceEncoder

        encoder = SentenceEncoder(model_dir, pooling="mean", device="cpu")
        encoder.encode(["warm up"])
    pin = _leave_a_heap_hole(libc)
    kept = _resident_bytes()
    if encoder is None:
        assert resources.return_free_memory() is True
    else:
        encoder.encode(["A man plays a guitar.", "Someone plays music."])
    assert kept - _resident_bytes() >= 100 << 20, "the 200 MB freed in the heap stayed resident"
    libc.free(pin)


def _in_fresh_process(model_dir: str | None) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")]))
    code = f"from tests.test_resources import _trim_check; _trim_check({model_dir!r})"
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


needs_glibc = pytest.mark.skipif(_glibc() is None, reason="glibc only (malloc_trim)")


@needs_glibc
def test_return_free_memory_gives_a_freed_heap_hole_back() -> None:
    _in_fresh_process(None)


@needs_glibc
def test_cpu_encoding_returns_freed_memory_once_per_chunk(tiny_model_dir) -> None:
    """Issue 24, item 9: memory freed inside a CPU encode (activations of each batch shape) goes back to the system
    at the chunk's end instead of staying in an ever-growing heap."""
    _in_fresh_process(str(tiny_model_dir))


def test_return_free_memory_is_a_no_op_off_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    monkeypatch.setattr(resources, "_libc", None)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert resources.return_free_memory() is False
