"""Shared data of the search tests: random vectors with a brute-force reference, and a small fitted model with a
corpus whose sentences the tiny encoder tells apart."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import Embedder, StandardNormCalibrator
from bertflow.search.ann import faiss_available

from ..conftest import SENTENCES

# Sentences of 1..64 words. Under transformers 5 the tiny fixture's tokenizer maps every word to [UNK] (its vocab
# file is not read), so for the tiny model only the token count tells sentences apart: make every count distinct.
WORDS = " ".join(SENTENCES * 2).split()
CORPUS = [" ".join(WORDS[:n]) for n in range(1, 65)]

needs_faiss = pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed (optional extra)")


def brute_force(corpus: np.ndarray, queries: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    c, q = corpus.astype(np.float64), queries.astype(np.float64)
    if metric == "cosine":
        c = c / np.linalg.norm(c, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
    scores = q @ c.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, 1), rows


@pytest.fixture()
def vectors() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(500, 16)).astype(np.float32), rng.normal(size=(37, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def model(tiny_encoder) -> Embedder:
    return Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS, regime="test")


@pytest.fixture(scope="module")
def unit_cloud() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    corpus = rng.normal(size=(5000, 32)).astype(np.float32)
    queries = rng.normal(size=(200, 32)).astype(np.float32)
    return corpus / np.linalg.norm(corpus, axis=1, keepdims=True), queries
