"""bertflow.resources: usable cores, thread limits that are restored, the machine record of reports."""

from __future__ import annotations

import os

import pytest
import torch
from threadpoolctl import threadpool_info

from bertflow import resources


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


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


def _glibc_with_mallinfo2():  # noqa: ANN202
    """glibc as a ctypes library with ``mallinfo2`` (2.33+) set up, or None."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def _heap_check(model_dir: str) -> None:
    """Body of the next test, run in a fresh process: there the heap holds no free space left by earlier tests
    (glibc serves a block from free heap space whatever the threshold, so in a long test process the outcome
    depended on what ran before)."""
    from bertflow import SentenceEncoder

    libc = _glibc_with_mallinfo2()
    assert libc is not None
    encoder = SentenceEncoder(model_dir, pooling="mean", device="cpu")
    # A freed 24 MB mapping raises glibc's dynamic threshold to 24 MB, as the first activations of a forward did.
    libc.free(libc.malloc(24 << 20))
    encoder.encode(["A man plays a guitar.", "Someone plays music."])
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(4 << 20)
    try:
        mapped = libc.mallinfo2().hblkhd - before
    finally:
        libc.free(block)
    assert mapped >= 4 << 20, f"a 4 MB block came from the heap ({mapped} bytes newly mapped)"
    assert resources.bound_heap_growth() is True


def test_cpu_encoding_keeps_large_buffers_out_of_the_heap(tiny_model_dir) -> None:
    """Issue 24, item 9: after a CPU encode, a freed multi-MB buffer goes back to the system (its own mapping),
    whatever sizes were freed before; glibc's dynamic threshold would have put it in the ever-growing heap."""
    import subprocess
    import sys
    from pathlib import Path

    if _glibc_with_mallinfo2() is None:
        pytest.skip("needs glibc 2.33+ (mallinfo2)")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root), env.get("PYTHONPATH", "")])
    code = f"from tests.test_resources import _heap_check; _heap_check({str(tiny_model_dir)!r})"
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_bound_heap_growth_leaves_a_users_threshold_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "_heap_bounded", None)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert resources.bound_heap_growth() is False
