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
