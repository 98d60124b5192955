"""Fixtures of the distributed tests: an input file of varied sentences and one-thread CPU references."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bertflow.scale.store import write_store

from ..conftest import SENTENCES


def make_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of 1 to 4 test sentences joined: lengths vary, so length-sorting matters."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(SENTENCES, size=int(rng.integers(1, 5)))) for _ in range(n)]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread, as every rank of the tests does, so results compare bit for bit."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def reference(encoder, lines: list[str], *, batch_size: int, chunk_size: int) -> np.ndarray:
    """What one process gives: ``iter_encode`` over the whole input, concatenated."""
    with one_thread():
        return np.concatenate(list(encoder.iter_encode(lines, batch_size=batch_size, chunk_size=chunk_size)))


@pytest.fixture()
def corpus_file(tmp_path: Path) -> tuple[Path, list[str]]:
    """A 203-line UTF-8 file with a BOM, CRLF line ends and no final newline (all allowed by the readers)."""
    lines = make_lines(203)
    path = tmp_path / "corpus.txt"
    path.write_bytes(("\ufeff" + "\r\n".join(lines)).encode("utf-8"))
    return path, lines


def anisotropic32_rows() -> np.ndarray:
    """[600, 12] float32 correlated, shifted, non-Gaussian rows with one constant column (index 7)."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(600, 12)) @ rng.normal(size=(12, 12))
    x = (base + 0.3 * base**2 / 10 + 5.0).astype(np.float32)
    x[:, 7] = 0.25
    return x


@pytest.fixture()
def anisotropic32() -> np.ndarray:
    return anisotropic32_rows()


@pytest.fixture()
def matrix() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(103, 5)).astype(np.float32)


@pytest.fixture()
def store(tmp_path, matrix):
    return write_store(matrix, tmp_path / "store", shard_size=10)
