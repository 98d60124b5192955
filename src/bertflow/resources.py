"""What this process may use of the machine: usable cores, CPU thread limits, process-wide settings that
concurrent users hold (:class:`CountedSetting`), and a description for reports.

A leaf module: it imports nothing of bertflow but the version, and torch, threadpoolctl and the libraries named in
:func:`machine_info` only when called (``import bertflow.resources`` stays cheap).
"""

from __future__ import annotations

import contextlib
import os
import platform
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ._version import __version__

_libc: Any = None  # glibc's handle once looked up; False off glibc


class CountedSetting:
    """A process-wide setting that concurrent users hold: the first :meth:`hold` saves it (``get()``) and sets the
    value asked for (``put(value)``), later ones only count, and the last :meth:`release` puts the saved one back,
    so overlapping users (threads of concurrent encodes) never restore it under each other."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]) -> None:
        self._get, self._put = get, put
        self._lock = threading.Lock()
        self._users = 0
        self._saved: Any = None
        if hasattr(os, "register_at_fork"):  # a child forked while another thread held the lock would wait forever
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # In a child forked while threads held the setting: they do not exist there, so nobody would put the saved
        # value back (the collector, say, would stay paused in the child for good). The child starts unheld.
        if self._users:
            self._put(self._saved)
        self._lock, self._users = threading.Lock(), 0

    def hold(self, value: Any) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = self._get()
                self._put(value)
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._put(self._saved)

    @contextlib.contextmanager
    def held(self, value: Any) -> Iterator[None]:
        """:meth:`hold` ``value`` for the ``with`` block."""
        self.hold(value)
        try:
            yield
        finally:
            self.release()


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask: what a container or ``taskset`` grants, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def return_free_memory() -> bool:
    """Give the free pages of glibc's heap back to the system (``malloc_trim(0)``); a no-op off glibc. Returns
    whether ``malloc_trim`` ran and released at least one page.

    Why: after the first forward passes on CPU, activations (MBs, a new size for each batch shape) come from
    glibc's heap, whose free holes it neither reuses for the next batch nor returns (docs/robustness.md, item 9).
    The encoder calls this once per chunk, so resident memory stays bounded by one chunk's worth.
    """
    global _libc
    if _libc is None:
        _libc = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            import ctypes

            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL("libc.so.6")
                libc.malloc_trim.argtypes = [ctypes.c_size_t]
                _libc = libc
    return bool(_libc and _libc.malloc_trim(0))


def set_torch_threads(n: int) -> int:
    """Set torch's intra-op CPU thread count to ``n`` (at least 1) for the process; returns the count before."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    return previous


@contextlib.contextmanager
def limited_threads(torch_threads: int | None = None, blas_threads: int | None = None) -> Iterator[None]:
    """Limit torch's intra-op threads and numpy/scipy's BLAS threads (``threadpoolctl``) for the ``with`` block
    (``None``: unchanged). Small matrices gain nothing from many threads, and on busy cores a multi-threaded kernel
    waits on barriers: the calibrators' fits and scoring run with one thread."""
    with contextlib.ExitStack() as stack:
        if blas_threads is not None:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(blas_threads))
        if torch_threads is not None:
            previous = set_torch_threads(torch_threads)
            stack.callback(set_torch_threads, previous)
        yield


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous row range ``[lo, hi)`` of rank ``rank`` when ``n`` rows are split as evenly as possible."""
    return n * rank // world, n * (rank + 1) // world


def share_cpu_threads(devices: Sequence[str], index: int, threads: int | None = None) -> None:
    """Set the torch threads of rank ``index`` of ``devices``: ``threads`` if given, else the usable cores split
    evenly between the CPU ranks (several CPU ranks each running torch's default thread pool would oversubscribe
    the cores many times over)."""
    n_cpu = sum(1 for d in devices if str(d).startswith("cpu"))
    if threads is not None:
        set_torch_threads(threads)
    elif str(devices[index]).startswith("cpu") and n_cpu > 1:
        set_torch_threads(usable_cpus() // n_cpu)


def machine_info(device: str | None = None) -> dict[str, Any]:
    """Platform, CPU model and counts, library versions and compute device: what a reader needs to compare
    numbers taken on different machines (reports of ``bertflow reproduce`` / ``evaluate``, benchmarks)."""
    import numpy as np
    import scipy
    import torch
    import transformers

    cpu_model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "torch_threads": torch.get_num_threads(),
        "device": dev,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "bertflow": __version__,
    }
    if dev.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(dev))
    return info
