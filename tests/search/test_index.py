"""bertflow.search.index: an EmbeddingIndex's rows, hits, model check and saved folder (checksums, edits refused,
approximate kind kept, loads racing saves)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertflow import CompatibilityError, Embedder, EmbeddingIndex, InputError, ModelFileError, SearchHit
from bertflow.errors import OutputError
from bertflow.search.index import INDEX_ANN, INDEX_CONFIG, INDEX_EMBEDDINGS, _content_digest
from bertflow.search.sentences import index_sentences

from ..safety import loads_during_saves
from .conftest import CORPUS, brute_force, needs_faiss


def test_search_hits_ids_texts_and_shapes(vectors):
    corpus, queries = vectors
    ids = [f"doc-{i}" for i in range(len(corpus))]
    texts = [f"text {i}" for i in range(len(corpus))]
    index = EmbeddingIndex.build(corpus, ids=ids, texts=texts)
    one = index.search(corpus[42], top_k=3)[0]  # a single vector counts as one query
    assert isinstance(one[0], SearchHit)
    assert one[0] == SearchHit(id="doc-42", score=pytest.approx(1.0, abs=1e-6), text="text 42", row=42)
    assert [h.score for h in one] == sorted((h.score for h in one), reverse=True)
    many = index.search(queries[:4], top_k=5)
    assert len(many) == 4 and all(len(hits) == 5 for hits in many)
    assert len(index.search(queries[:2], top_k=10_000)[0]) == len(corpus)  # capped at the index size
    bare = EmbeddingIndex.build(corpus)
    assert bare.search(corpus[7], top_k=1)[0][0] == SearchHit(id=7, score=pytest.approx(1.0), text=None, row=7)


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


def test_faiss_saved_index_loads_without_faiss(vectors, tmp_path, monkeypatch):
    corpus, queries = vectors
    path = EmbeddingIndex.build(corpus).save(tmp_path / "idx")
    config = json.loads((path / INDEX_CONFIG).read_text())
    config["backend"] = "faiss"
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    monkeypatch.setattr("bertflow.search.index.faiss_available", lambda: False)
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
    assert EmbeddingIndex.load(path).search(corpus[1], top_k=1)[0][0].id == "b"
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


@needs_faiss
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_kind_survives_save_and_load(unit_cloud, kind, tmp_path, monkeypatch):
    corpus, queries = unit_cloud
    index = EmbeddingIndex.build(corpus[:2000], approximate=kind, nprobe=3, ef_search=40)
    path = index.save(tmp_path / "idx")
    config = json.loads((path / INDEX_CONFIG).read_text())
    assert config["approximate"] == kind and config["ann_params"]["nprobe"] == 3
    assert config["recall"]["kind"] == kind and 0 < config["recall"]["recall_at_k"] <= 1  # measured and reported
    assert {p.name for p in path.iterdir()} == {INDEX_CONFIG, INDEX_EMBEDDINGS, INDEX_ANN}
    loaded = EmbeddingIndex.load(path)  # the saved faiss index is read, not rebuilt
    assert loaded.approximate == kind and loaded.ann_params == index.ann_params and loaded._ann[0] == kind
    assert loaded.recall == index.recall
    read = loaded._ann[1]
    np.testing.assert_array_equal(loaded.topk(queries, 10)[1], index.topk(queries, 10)[1])
    assert loaded._ann[1] is read  # the query used the file's index
    monkeypatch.undo()
    assert EmbeddingIndex.load(path, approximate="exact").search_kind() == "exact"
    # Saved approximate, no faiss here: exact.
    monkeypatch.setattr("bertflow.search.index.faiss_available", lambda: False)
    assert EmbeddingIndex.load(path).search_kind() == "exact"
    monkeypatch.undo()
    ann = (path / INDEX_ANN).read_bytes()
    (path / INDEX_ANN).write_bytes(ann[:-10])  # a truncated faiss file is refused, not half-read
    with pytest.raises(ModelFileError, match="ann.faiss does not match its checksum"):
        EmbeddingIndex.load(path)
    (path / INDEX_ANN).write_bytes(ann)
    config["approximate"] = "exact"  # an edited kind is caught by the content checksum
    (path / INDEX_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="checksum"):
        EmbeddingIndex.load(path)


def test_overwrite_refuses_an_index_folder_holding_foreign_files(tiny_encoder, saved_model, tmp_path):
    index = index_sentences(Embedder.load(saved_model), CORPUS[:6])
    path = index.save(tmp_path / "idx")
    (path / "README.txt").write_text("what this index is for", encoding="utf-8")
    with pytest.raises(OutputError, match="README.txt"):
        index.save(path, overwrite=True)
    assert (path / "README.txt").read_text(encoding="utf-8") == "what this index is for"
    (path / "README.txt").unlink()
    index.save(path, overwrite=True)


def test_index_loads_during_concurrent_saves(tmp_path):
    a = EmbeddingIndex.build(np.eye(8, dtype=np.float32)).save(tmp_path / "a")
    b = EmbeddingIndex.build(np.ones((5, 8), dtype=np.float32) + np.eye(5, 8, dtype=np.float32)).save(tmp_path / "b")
    sizes, _ = loads_during_saves(lambda target: len(EmbeddingIndex.load(target)), a, b, tmp_path / "idx")
    assert sizes and set(sizes) <= {8, 5}
