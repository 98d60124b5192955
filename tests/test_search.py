"""EmbeddingIndex (exact top-k, save/load, model identity), built and queried with an Embedder, API and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bertflow import (
    CompatibilityError,
    Embedder,
    FlowCalibrator,
    InputError,
    ModelFileError,
    SentenceEncoder,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.errors import OutputError
from bertflow.search import INDEX_CONFIG, INDEX_EMBEDDINGS, EmbeddingIndex, SearchHit, _content_digest, faiss_available

from .conftest import SENTENCES, invoke
from .safety import _WRITER_SCRIPT, SRC, clear_race_error

# Sentences of 1..64 words. Under transformers 5 the tiny fixture's tokenizer maps every word to [UNK] (its vocab
# file is not read), so for the tiny model only the token count tells sentences apart: make every count distinct.
WORDS = " ".join(SENTENCES * 2).split()
CORPUS = [" ".join(WORDS[:n]) for n in range(1, 65)]


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


# -- EmbeddingIndex -----------------------------------------------------------------------------------------


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


def test_search_hits_ids_texts_and_shapes(vectors):
    corpus, queries = vectors
    ids = [f"doc-{i}" for i in range(len(corpus))]
    texts = [f"text {i}" for i in range(len(corpus))]
    index = EmbeddingIndex.build(corpus, ids=ids, texts=texts)
    one = index.search(corpus[42], top_k=3)  # a single vector gives one list
    assert isinstance(one[0], SearchHit)
    assert one[0] == SearchHit(id="doc-42", score=pytest.approx(1.0, abs=1e-6), text="text 42", row=42)
    assert [h.score for h in one] == sorted((h.score for h in one), reverse=True)
    many = index.search(queries[:4], top_k=5)
    assert len(many) == 4 and all(len(hits) == 5 for hits in many)
    assert len(index.search(queries[:2], top_k=10_000)[0]) == len(corpus)  # capped at the index size
    bare = EmbeddingIndex.build(corpus)
    assert bare.search(corpus[7], top_k=1)[0].id == 7 and bare.search(corpus[7], top_k=1)[0].text is None


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


def test_index_input_errors(vectors):
    corpus, queries = vectors
    index = EmbeddingIndex.build(corpus[:10], ids=list("abcdefghij"), texts=[str(i) for i in range(10)])
    with pytest.raises(InputError, match="'a'.*twice"):
        index.add(corpus[:1], ids=["a"], texts=["x"])
    with pytest.raises(InputError, match="texts="):
        index.add(corpus[:1], ids=["k"])
    with pytest.raises(InputError, match="2 ids for 1 rows"):
        index.add(corpus[:1], ids=["k", "l"], texts=["x"])
    with pytest.raises(InputError, match="strings or integers"):
        index.add(corpus[:1], ids=[1.5], texts=["x"])
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        index.search(np.ones(8, np.float32))
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        index.add(np.ones((2, 8), np.float32))
    bad = corpus[:2].copy()
    bad[1, 3] = np.nan
    with pytest.raises(InputError, match="row 1, column 3"):
        index.add(bad, ids=["y", "z"], texts=["y", "z"])
    with pytest.raises(InputError, match="top_k"):
        index.search(queries[0], top_k=0)
    with pytest.raises(InputError, match="metric"):
        EmbeddingIndex(16, metric="l2")  # type: ignore[arg-type]
    assert len(index) == 10  # failed adds leave the index unchanged


def test_save_load_round_trip(vectors, tmp_path):
    corpus, queries = vectors
    ids = [f"d{i}" for i in range(len(corpus))]
    index = EmbeddingIndex.build(corpus, ids=ids, texts=[f"t{i}" for i in range(len(corpus))], model={"x": 1})
    path = index.save(tmp_path / "idx")
    assert {p.name for p in path.iterdir()} == {INDEX_CONFIG, INDEX_EMBEDDINGS}
    loaded = EmbeddingIndex.load(path)
    assert loaded.ids == ids and loaded.texts == index.texts and loaded.model == {"x": 1}
    assert loaded.search(queries[:5], top_k=4) == index.search(queries[:5], top_k=4)
    loaded.add(corpus[:1], ids=["new"], texts=["new"])  # a loaded index keeps growing
    assert len(loaded) == len(corpus) + 1


def test_load_refuses_damaged_index(vectors, tmp_path):
    corpus, _ = vectors
    path = EmbeddingIndex.build(corpus[:20]).save(tmp_path / "idx")
    weights = path / INDEX_EMBEDDINGS
    original = weights.read_bytes()
    weights.write_bytes(original[:-64])
    with pytest.raises(ModelFileError, match="checksum"):
        EmbeddingIndex.load(path)
    weights.write_bytes(original)
    config = json.loads((path / INDEX_CONFIG).read_text())
    config["ids"] = config["ids"][:-1]
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="index.json does not match its checksum"):
        EmbeddingIndex.load(path)
    config["content_sha256"] = _content_digest(config)  # an edit that also forges the checksum: still inconsistent
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="inconsistent"):
        EmbeddingIndex.load(path)
    config["format_version"] = 99
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"index.json is a search index written by .* upgrade bertflow"):
        EmbeddingIndex.load(path)
    with pytest.raises(ModelFileError, match="not a folder"):
        EmbeddingIndex.load(tmp_path / "nope")


@pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed (optional extra)")
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


# -- EmbeddingIndex.from_sentences / query (with an Embedder) ----------------------------------------------


def test_embedder_search_finds_the_sentence_itself(model):
    index = EmbeddingIndex.from_sentences(model, CORPUS)
    assert len(index) == len(CORPUS) and index.dim == 32
    hits = index.query(model, CORPUS[10], top_k=3)[0]
    assert hits[0].id == 10 and hits[0].text == CORPUS[10] and hits[0].score == pytest.approx(1.0, abs=1e-5)
    batch = index.query(model, CORPUS[:5], top_k=2)
    assert [h[0].id for h in batch] == [0, 1, 2, 3, 4]
    # The index scores are the Embedder's own cosine similarities.
    sims = model.similarity(CORPUS[3], CORPUS)[0]
    assert [h.id for h in index.query(model, [CORPUS[3]], top_k=5)[0]] == list(np.argsort(-sims, kind="stable")[:5])


def test_embedder_search_errors(tiny_encoder):
    fresh = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    with pytest.raises(InputError, match="from_file"):
        EmbeddingIndex.from_sentences(fresh, "corpus.txt")  # a string is not a corpus
    with pytest.raises(InputError, match="sentence 1"):
        EmbeddingIndex.from_sentences(fresh, ["fine", "  "])
    with pytest.raises(InputError, match="one id per sentence"):
        EmbeddingIndex.from_sentences(fresh, CORPUS[:3], ids=["a"])


def test_build_index_from_file_ids_are_line_numbers(model, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("The cat sleeps.\n\nA dog runs across the park.\nThe cat sleeps.\n", encoding="utf-8")
    index = EmbeddingIndex.from_file(model, path)
    assert index.ids == [1, 3, 4] and index.texts[1] == "A dog runs across the park."
    assert EmbeddingIndex.from_file(model, path, unique=True).ids == [1, 3]
    tsv = tmp_path / "docs.tsv"
    tsv.write_text("id\ttext\nx\tThe cat sleeps.\ny\tA man is playing a guitar.\n", encoding="utf-8")
    index = EmbeddingIndex.from_file(model, tsv, column="text")
    assert index.ids == [1, 2] and index.query(model, "A man is playing a guitar.", top_k=1)[0][0].id == 2


def test_index_refused_by_another_model(model, tiny_encoder, other_tiny_model_dir, tmp_path):
    built = EmbeddingIndex.from_sentences(model, CORPUS)
    path = built.save(tmp_path / "idx")
    # The same model, saved and loaded: accepted (its identity survives the round trip).
    reloaded = Embedder.load(model.save(tmp_path / "model"), device="cpu")
    assert reloaded.identity() == model.identity()
    loaded = EmbeddingIndex.load(path)
    assert loaded.query(reloaded, CORPUS[5], top_k=1)[0][0].id == 5
    others = {
        "calibrator type": Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(CORPUS),
        "calibrator fingerprint": Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS[:40]),
        "encoder fingerprint": Embedder(
            SentenceEncoder(str(other_tiny_model_dir), device="cpu"), StandardNormCalibrator()
        ).fit(CORPUS),
    }
    for difference, other in others.items():
        with pytest.raises(CompatibilityError, match=difference):
            loaded.query(other, "The cat sleeps.")
        with pytest.raises(CompatibilityError, match="rebuild the index"):
            built.add_sentences(other, ["The cat sleeps."])
    with pytest.raises(CompatibilityError, match="bare vectors"):
        EmbeddingIndex.build(np.ones((2, 32), np.float32)).query(model, "The cat sleeps.")


def test_moved_model_and_index_folders_still_find_each_other(model, tmp_path, monkeypatch):
    """The index records its model portably (a path relative to the index folder, the encoder by name), so the two
    folders moved together still work, and the index file holds no absolute path of this machine."""
    import json
    import shutil

    home = tmp_path / "home"
    saved = Embedder.load(model.save(home / "model"), device="cpu")
    EmbeddingIndex.from_sentences(saved, CORPUS).save(home / "idx")
    recorded = (home / "idx" / "index.json").read_text(encoding="utf-8")
    assert str(tmp_path) not in recorded
    assert json.loads(recorded)["model_local_path"] == "../model"
    moved = tmp_path / "elsewhere"
    shutil.move(str(home), str(moved))
    monkeypatch.chdir(tmp_path)
    index = EmbeddingIndex.load(moved / "idx")
    assert Path(index.model_source) == (moved / "model").resolve()
    again = Embedder.load(index.model_source, device="cpu")
    assert index.query(again, CORPUS[7], top_k=1)[0][0].id == 7


def test_flow_identity_is_stable_and_seed_sensitive(tiny_encoder, tmp_path):
    a = Embedder(tiny_encoder, FlowCalibrator(max_steps=5, seed=0)).fit(CORPUS)
    b = Embedder(tiny_encoder, FlowCalibrator(max_steps=5, seed=1)).fit(CORPUS)
    assert a.identity() != b.identity()
    assert Embedder.load(a.save(tmp_path / "a"), device="cpu").identity() == a.identity()


# -- CLI ----------------------------------------------------------------------------------------------------


def test_faiss_saved_index_loads_without_faiss(vectors, tmp_path, monkeypatch):
    corpus, queries = vectors
    path = EmbeddingIndex.build(corpus).save(tmp_path / "idx")
    config = json.loads((path / INDEX_CONFIG).read_text())
    config["backend"] = "faiss"
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    monkeypatch.setattr("bertflow.search.faiss_available", lambda: False)
    loaded = EmbeddingIndex.load(path)
    assert loaded.backend == "torch"
    np.testing.assert_array_equal(loaded.topk(queries, 5)[1], brute_force(corpus, queries, 5, "cosine")[1])


@pytest.mark.parametrize("edit", ["swap two ids", "change a text", "drop the checksum"])
def test_edited_ids_or_texts_are_refused(vectors, tmp_path, edit):
    """Ids and texts are what a hit returns: an edit that keeps their count used to load and return wrong hits."""
    corpus, _ = vectors
    path = EmbeddingIndex.build(corpus[:5], ids=list("abcde"), texts=[f"text {i}" for i in range(5)]).save(
        tmp_path / "idx"
    )
    assert EmbeddingIndex.load(path).search(corpus[1], top_k=1)[0].id == "b"
    config = json.loads((path / INDEX_CONFIG).read_text())
    if edit == "swap two ids":
        config["ids"][0], config["ids"][1] = config["ids"][1], config["ids"][0]
    elif edit == "change a text":
        config["texts"][2] = "something else"
    else:
        del config["content_sha256"]
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="checksum"):
        EmbeddingIndex.load(path)


# -- approximate search (FAISS HNSW / IVF) ------------------------------------------------------------------

needs_faiss = pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed (optional extra)")


@pytest.fixture(scope="module")
def unit_cloud() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    corpus = rng.normal(size=(5000, 32)).astype(np.float32)
    queries = rng.normal(size=(200, 32)).astype(np.float32)
    return corpus / np.linalg.norm(corpus, axis=1, keepdims=True), queries


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


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
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", index._prepare(queries), corpus[rows]), atol=1e-5)


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
    from bertflow import search

    corpus, queries = unit_cloud
    index = EmbeddingIndex.build(corpus)
    assert index.approximate == "auto" and index.search_kind() == "exact"
    _, rows = index.topk(queries, 10)
    np.testing.assert_array_equal(rows, brute_force(corpus, queries, 10, "cosine")[1])
    assert index._ann is None  # no approximate structure was built
    monkeypatch.setattr(search, "AUTO_APPROXIMATE_MIN_ROWS", len(corpus))
    monkeypatch.setattr(search, "faiss_available", lambda: False)
    assert index.search_kind() == "exact" and index.recall is None  # no faiss: exact, with a logged note


@needs_faiss
def test_auto_chooses_hnsw_only_with_a_measured_recall(monkeypatch):
    """Above the row threshold, auto measures HNSW's recall@10 on held-out rows of the index: isotropic 64-d data
    with a sparse graph misses most neighbours and stays exact; clustered 3-d data is easy and goes approximate."""
    from bertflow import search

    monkeypatch.setattr(search, "AUTO_APPROXIMATE_MIN_ROWS", 3000)
    rng = np.random.default_rng(11)
    hard = EmbeddingIndex.build(rng.normal(size=(3000, 64)).astype(np.float32), hnsw_m=4, ef_search=10)
    assert hard.search_kind() == "exact"
    assert hard.recall["kind"] == "hnsw" and hard.recall["recall_at_k"] < 0.8 and hard.recall["sample"] == 500
    assert hard._ann is None  # the graph built for the measurement is freed
    centres = rng.normal(size=(20, 3)) * 10
    easy_rows = (centres[rng.integers(0, 20, 3000)] + rng.normal(size=(3000, 3))).astype(np.float32)
    easy = EmbeddingIndex.build(easy_rows)
    assert easy.search_kind() == "hnsw" and easy.recall["recall_at_k"] >= search.AUTO_MIN_RECALL
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


@needs_faiss
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_kind_survives_save_and_load(unit_cloud, kind, tmp_path, monkeypatch):
    from bertflow import search

    corpus, queries = unit_cloud
    index = EmbeddingIndex.build(corpus[:2000], approximate=kind, nprobe=3, ef_search=40)
    path = index.save(tmp_path / "idx")
    config = json.loads((path / INDEX_CONFIG).read_text())
    assert config["approximate"] == kind and config["ann_params"]["nprobe"] == 3
    assert config["recall"]["kind"] == kind and 0 < config["recall"]["recall_at_k"] <= 1  # measured and reported
    assert {p.name for p in path.iterdir()} == {INDEX_CONFIG, INDEX_EMBEDDINGS, search.INDEX_ANN}
    loaded = EmbeddingIndex.load(path)  # the saved faiss index is read, not rebuilt
    assert loaded.approximate == kind and loaded.ann_params == index.ann_params and loaded._ann[0] == kind
    assert loaded.recall == index.recall
    read = loaded._ann[1]
    np.testing.assert_array_equal(loaded.topk(queries, 10)[1], index.topk(queries, 10)[1])
    assert loaded._ann[1] is read  # the query used the file's index
    monkeypatch.undo()
    assert EmbeddingIndex.load(path, approximate="exact").search_kind() == "exact"
    monkeypatch.setattr(search, "faiss_available", lambda: False)  # saved approximate, no faiss here: exact
    assert EmbeddingIndex.load(path).search_kind() == "exact"
    monkeypatch.undo()
    ann = (path / search.INDEX_ANN).read_bytes()
    (path / search.INDEX_ANN).write_bytes(ann[:-10])  # a truncated faiss file is refused, not half-read
    with pytest.raises(ModelFileError, match="ann.faiss is missing or does not match its checksum"):
        EmbeddingIndex.load(path)
    (path / search.INDEX_ANN).write_bytes(ann)
    config["approximate"] = "exact"  # an edited kind is caught by the content checksum
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="checksum"):
        EmbeddingIndex.load(path)


def test_bad_approximate_values_are_one_line_errors(model, tmp_path):
    with pytest.raises(InputError, match="approximate must be one of auto, exact, hnsw, ivf; got 'annoy'"):
        EmbeddingIndex(16, approximate="annoy")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="nprobe must be a positive integer"):
        EmbeddingIndex(16, approximate="ivf", nprobe=0)
    model_dir = model.save(tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    r = invoke("search", "build", corpus, "--model-dir", model_dir, "-o", tmp_path / "idx", "--approximate", "lsh")
    assert r.exit_code == 2 and "approximate must be one of" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "idx").exists()


def test_overwrite_refuses_an_index_folder_holding_foreign_files(tiny_encoder, saved_model, tmp_path):
    index = EmbeddingIndex.from_sentences(Embedder.load(saved_model), CORPUS[:6])
    path = index.save(tmp_path / "idx")
    (path / "README.txt").write_text("what this index is for", encoding="utf-8")
    with pytest.raises(OutputError, match="README.txt"):
        index.save(path, overwrite=True)
    assert (path / "README.txt").read_text(encoding="utf-8") == "what this index is for"
    (path / "README.txt").unlink()
    index.save(path, overwrite=True)


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
