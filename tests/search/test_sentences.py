"""bertflow.search.sentences: an index built from sentences or a file with an Embedder, extended and queried, and
refused by another model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertflow import (
    CompatibilityError,
    Embedder,
    EmbeddingIndex,
    FlowCalibrator,
    InputError,
    SentenceEncoder,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.search.sentences import add_sentences, index_file, index_sentences, query

from .conftest import CORPUS


def test_embedder_search_finds_the_sentence_itself(model):
    index = index_sentences(model, CORPUS)
    assert len(index) == len(CORPUS) and index.dim == 32
    hits = query(index, model, CORPUS[10], top_k=3)[0]
    assert hits[0].id == 10 and hits[0].text == CORPUS[10] and hits[0].score == pytest.approx(1.0, abs=1e-5)
    batch = query(index, model, CORPUS[:5], top_k=2)
    assert [h[0].id for h in batch] == [0, 1, 2, 3, 4]
    # The index scores are the Embedder's own cosine similarities.
    sims = model.similarity(CORPUS[3], CORPUS)[0].numpy()
    assert [h.id for h in query(index, model, [CORPUS[3]], top_k=5)[0]] == list(np.argsort(-sims, kind="stable")[:5])


def test_embedder_search_errors(tiny_encoder):
    fresh = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    with pytest.raises(InputError, match="index_file"):
        index_sentences(fresh, "corpus.txt")  # a string is not a corpus
    with pytest.raises(InputError, match="sentence 1"):
        index_sentences(fresh, ["fine", "  "])
    with pytest.raises(InputError, match="one id per sentence"):
        index_sentences(fresh, CORPUS[:3], ids=["a"])


def test_build_index_from_file_ids_are_line_numbers(model, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("The cat sleeps.\n\nA dog runs across the park.\nThe cat sleeps.\n", encoding="utf-8")
    index = index_file(model, path)
    assert index.ids == [1, 3, 4] and index.texts[1] == "A dog runs across the park."
    assert index_file(model, path, unique=True).ids == [1, 3]
    tsv = tmp_path / "docs.tsv"
    tsv.write_text("id\ttext\nx\tThe cat sleeps.\ny\tA man is playing a guitar.\n", encoding="utf-8")
    index = index_file(model, tsv, column="text")
    assert index.ids == [1, 2] and query(index, model, "A man is playing a guitar.", top_k=1)[0][0].id == 2


def test_index_refused_by_another_model(model, tiny_encoder, other_tiny_model_dir, tmp_path):
    built = index_sentences(model, CORPUS)
    path = built.save(tmp_path / "idx")
    # The same model, saved and loaded: accepted (its identity survives the round trip).
    reloaded = Embedder.load(model.save(tmp_path / "model"), device="cpu")
    assert reloaded.identity() == model.identity()
    loaded = EmbeddingIndex.load(path)
    assert query(loaded, reloaded, CORPUS[5], top_k=1)[0][0].id == 5
    others = {
        "calibrator type": Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(CORPUS),
        "calibrator fingerprint": Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS[:40]),
        "encoder fingerprint": Embedder(
            SentenceEncoder(str(other_tiny_model_dir), device="cpu"), StandardNormCalibrator()
        ).fit(CORPUS),
    }
    for difference, other in others.items():
        with pytest.raises(CompatibilityError, match=difference):
            query(loaded, other, "The cat sleeps.")
        with pytest.raises(CompatibilityError, match="rebuild the index"):
            add_sentences(built, other, ["The cat sleeps."])
    with pytest.raises(CompatibilityError, match="bare vectors"):
        query(EmbeddingIndex.build(np.ones((2, 32), np.float32)), model, "The cat sleeps.")


def test_moved_model_and_index_folders_still_find_each_other(model, tmp_path, monkeypatch):
    """The index records its model portably (a path relative to the index folder, the encoder by name), so the two
    folders moved together still work, and the index file holds no absolute path of this machine."""
    import json
    import shutil

    home = tmp_path / "home"
    saved = Embedder.load(model.save(home / "model"), device="cpu")
    index_sentences(saved, CORPUS).save(home / "idx")
    recorded = (home / "idx" / "index.json").read_text(encoding="utf-8")
    assert str(tmp_path) not in recorded
    assert json.loads(recorded)["model_local_path"] == "../model"
    moved = tmp_path / "elsewhere"
    shutil.move(str(home), str(moved))
    monkeypatch.chdir(tmp_path)
    index = EmbeddingIndex.load(moved / "idx")
    assert Path(index.model_source) == (moved / "model").resolve()
    again = Embedder.load(index.model_source, device="cpu")
    assert query(index, again, CORPUS[7], top_k=1)[0][0].id == 7


def test_flow_identity_is_stable_and_seed_sensitive(tiny_encoder, tmp_path):
    a = Embedder(tiny_encoder, FlowCalibrator(max_steps=5, seed=0)).fit(CORPUS)
    b = Embedder(tiny_encoder, FlowCalibrator(max_steps=5, seed=1)).fit(CORPUS)
    assert a.identity() != b.identity()
    assert Embedder.load(a.save(tmp_path / "a"), device="cpu").identity() == a.identity()
