"""bertflow.search.ann: exact top-k (torch blockwise, faiss flat) against brute force, and approximate search (faiss
HNSW / IVF) against exact, with ``auto`` choosing by measured recall."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import EmbeddingIndex, InputError
from bertflow.search import ann
from bertflow.search.ann import VectorSearch

from .conftest import brute_force, needs_faiss


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


@pytest.mark.parametrize("metric", ["cosine", "dot"])
@pytest.mark.parametrize("chunks", [(1024, 65536), (5, 7), (37, 500)])
def test_topk_matches_brute_force(vectors, metric, chunks):
    corpus, queries = vectors
    index = EmbeddingIndex.build(corpus, metric=metric)
    index.query_chunk_size, index.corpus_chunk_size = chunks
    scores, rows = index.topk(queries, 10)
    ref_scores, ref_rows = brute_force(corpus, queries, 10, metric)
    assert scores.shape == rows.shape == (37, 10) and scores.dtype == np.float32 and rows.dtype == np.int64
    np.testing.assert_array_equal(rows, ref_rows)  # random data: no ties
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_ties_are_ordered_by_row():
    corpus = np.tile(np.eye(4, dtype=np.float32), (3, 1))  # rows 0, 4, 8 identical, ...
    index = EmbeddingIndex.build(corpus)
    index.corpus_chunk_size = 5
    _, rows = index.topk(np.eye(4, dtype=np.float32)[[1]], 3)
    np.testing.assert_array_equal(rows, [[1, 5, 9]])


def test_add_in_parts_equals_build(vectors):
    corpus, queries = vectors
    whole = EmbeddingIndex.build(corpus)
    parts = EmbeddingIndex(16)
    for start in range(0, len(corpus), 120):
        parts.add(corpus[start : start + 120])
        parts.search(queries[0], top_k=2)  # searching between adds must not lose rows
    assert parts.ids == list(range(len(corpus)))
    np.testing.assert_array_equal(parts.topk(queries, 8)[1], whole.topk(queries, 8)[1])


@needs_faiss
def test_faiss_backend_matches_torch(vectors, tmp_path):
    corpus, queries = vectors
    torch_index = EmbeddingIndex.build(corpus)
    faiss_index = EmbeddingIndex.build(corpus[:300], backend="faiss")
    faiss_index.add(corpus[300:])
    s_t, r_t = torch_index.topk(queries, 10)
    s_f, r_f = faiss_index.topk(queries, 10)
    np.testing.assert_array_equal(r_f, r_t)
    np.testing.assert_allclose(s_f, s_t, atol=1e-5)
    reloaded = EmbeddingIndex.load(faiss_index.save(tmp_path / "f"))
    assert reloaded.backend == "faiss"
    np.testing.assert_array_equal(reloaded.topk(queries, 10)[1], r_t)


@needs_faiss
def test_hnsw_recall_against_exact(unit_cloud):
    corpus, queries = unit_cloud
    _, exact = EmbeddingIndex.build(corpus, approximate="exact").topk(queries, 10)
    index = EmbeddingIndex.build(corpus, approximate="hnsw")
    assert index.search_kind() == "hnsw"
    scores, rows = index.topk(queries, 10)
    # Random 32-d unit vectors are a hard case for HNSW (no cluster structure); it still reaches ~0.97+ here.
    assert recall_at(rows, exact) >= 0.9
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)  # cosine: scores of unit queries
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", unit, corpus[rows]), atol=1e-5)


@needs_faiss
def test_ivf_visiting_every_list_is_exact(unit_cloud):
    corpus, queries = unit_cloud
    s_exact, r_exact = EmbeddingIndex.build(corpus, approximate="exact").topk(queries, 10)
    nlist = round(len(corpus) ** 0.5)
    index = EmbeddingIndex.build(corpus, approximate="ivf", nprobe=nlist)
    s_ivf, r_ivf = index.topk(queries, 10)
    np.testing.assert_array_equal(r_ivf, r_exact)
    np.testing.assert_allclose(s_ivf, s_exact, atol=1e-5)
    index.ann_params["nprobe"] = 1  # one list of ~71 rows: approximate, and fewer than k hits are marked, not faked
    s1, r1 = index.topk(queries, 100)
    assert recall_at(r1[:, :10], r_exact) < 1.0
    assert np.all((r1 >= 0) | np.isneginf(s1))
    hits = index.search(queries[:20], top_k=100)
    assert all(h.row >= 0 for q in hits for h in q)


@needs_faiss
def test_rows_added_after_a_query_are_found(unit_cloud):
    corpus, _ = unit_cloud
    index = EmbeddingIndex.build(corpus[:1000], approximate="hnsw")
    index.topk(corpus[:1], 1)  # builds the HNSW graph
    index.add(corpus[1000:1100])
    _, rows = index.topk(corpus[1000:1100], 1)
    assert recall_at(rows, np.arange(1000, 1100)[:, None]) >= 0.95  # each new row finds itself


def test_auto_is_exact_below_the_threshold(unit_cloud, monkeypatch):
    corpus, queries = unit_cloud
    index = EmbeddingIndex.build(corpus)
    assert index.approximate == "auto" and index.search_kind() == "exact"
    _, rows = index.topk(queries, 10)
    np.testing.assert_array_equal(rows, brute_force(corpus, queries, 10, "cosine")[1])
    assert index._ann is None  # no approximate structure was built
    monkeypatch.setattr(ann, "AUTO_APPROXIMATE_MIN_ROWS", len(corpus))
    monkeypatch.setattr(ann, "faiss_available", lambda: False)
    assert index.search_kind() == "exact" and index.recall is None  # no faiss: exact, with a logged note


@needs_faiss
def test_auto_chooses_hnsw_only_with_a_measured_recall(monkeypatch):
    """Above the row threshold, auto measures HNSW's recall@10 on held-out rows of the index: isotropic 64-d data
    with a sparse graph misses most neighbours and stays exact; clustered 3-d data is easy and goes approximate."""
    monkeypatch.setattr(ann, "AUTO_APPROXIMATE_MIN_ROWS", 3000)
    rng = np.random.default_rng(11)
    hard = EmbeddingIndex.build(rng.normal(size=(3000, 64)).astype(np.float32), hnsw_m=4, ef_search=10)
    assert hard.search_kind() == "exact"
    assert hard.recall["kind"] == "hnsw" and hard.recall["recall_at_k"] < 0.8 and hard.recall["sample"] == 500
    assert hard._ann is None  # the graph built for the measurement is freed
    centres = rng.normal(size=(20, 3)) * 10
    easy_rows = (centres[rng.integers(0, 20, 3000)] + rng.normal(size=(3000, 3))).astype(np.float32)
    easy = EmbeddingIndex.build(easy_rows)
    assert easy.search_kind() == "hnsw" and easy.recall["recall_at_k"] >= ann.AUTO_MIN_RECALL
    exact = EmbeddingIndex.build(easy_rows, approximate="exact")
    measured = easy.measure_recall("hnsw", sample=3000)  # every row held out in turn: check by hand
    _, truth = exact.topk(easy_rows, 11)
    _, found = easy.topk(easy_rows, 11)
    by_hand = np.mean(
        [
            len({r for r in f if r != i} & set([r for r in t if r != i][:10])) / 10
            for i, (f, t) in enumerate(zip(found, truth, strict=True))
        ]
    )
    assert measured["recall_at_k"] == pytest.approx(by_hand, abs=1e-4)
    easy.add(easy_rows[:1] + 0.5)
    assert easy.recall is None  # new rows: measured again at the next query


def test_bad_approximate_values_are_one_line_errors():
    with pytest.raises(InputError, match="approximate must be one of auto, exact, hnsw, ivf; got 'annoy'"):
        VectorSearch(16, approximate="annoy")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="nprobe must be a positive integer"):
        VectorSearch(16, approximate="ivf", nprobe=0)
