"""The embedding cache and the one-pass multi-pooling encoder (bertflow.evaluation.cache)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from bertflow import SentenceEncoder
from bertflow.errors import InputError
from bertflow.evaluation.cache import (
    CACHE_DIR_ENV,
    EmbeddingCache,
    default_cache_dir,
    embed_cached,
    pooling_key,
    sentence_key,
)

from ..sts_layout import one_torch_thread, working_tiny_bert  # noqa: F401 - fixtures

SENTENCES = [
    "A man is playing a guitar.",
    "the cat sleeps on the mat",
    "Someone plays music.",
    "zq xv wk",
    "A plane is taking off from the airport runway while people watch and wave.",
    "  leading and trailing spaces  ",
    "the cat sleeps on the mat",  # duplicate on purpose
]
POOLINGS = ["mean", "cls", "first-last-avg", "last2avg", "0,2"]


@pytest.fixture()
def encoder(working_tiny_bert: Path) -> SentenceEncoder:  # noqa: F811
    return SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu")


def _count_forwards(encoder: SentenceEncoder) -> list[int]:
    """Batch sizes of every forward pass of ``encoder.model`` from now on (hook stays for the test)."""
    sizes: list[int] = []
    encoder.model.register_forward_pre_hook(
        lambda _m, args, kwargs: sizes.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True
    )
    return sizes


def test_pooling_key_is_canonical() -> None:
    assert pooling_key("first_last", 6) == pooling_key("first-last-avg", 6) == "first-last-avg"
    assert pooling_key([1, -1], 6) == pooling_key("1,6", 6) == "layers-1-6"
    assert pooling_key("MEAN", 6) == "mean"
    with pytest.raises(InputError):
        pooling_key("max", 6)


def test_sentence_key_is_exact_sha1() -> None:
    assert sentence_key("a") == "86f7e437faa5a7fce15d1ddcb9eaeaea377667b8"
    assert sentence_key("a ") != sentence_key("a") != sentence_key("A")


def test_encode_with_poolings_matches_single_pooling_encoders_in_one_pass(encoder: SentenceEncoder) -> None:
    sizes = _count_forwards(encoder)
    out = encoder.encode(SENTENCES, poolings=POOLINGS, batch_size=3)
    # One pass for all five poolings: forward calls of at most 3 rows carrying each sentence once.
    assert max(sizes) <= 3 and sum(sizes) == len(SENTENCES)
    assert set(out) == {"mean", "cls", "first-last-avg", "last2avg", "layers-0-2"}
    for spec, key in zip(POOLINGS, ["mean", "cls", "first-last-avg", "last2avg", "layers-0-2"], strict=True):
        single = SentenceEncoder(
            encoder.model_id, pooling=spec, device="cpu", model=encoder.model, tokenizer=encoder.tokenizer
        )
        np.testing.assert_allclose(out[key], single.encode(SENTENCES), atol=1e-5, err_msg=spec)
    # Rows of different sentences differ (the tokenizer is real); a duplicate agrees up to batch rounding.
    assert np.abs(out["mean"][0] - out["mean"][1]).max() > 1e-3
    np.testing.assert_allclose(out["mean"][1], out["mean"][6], atol=1e-6)


def test_encode_with_poolings_rejects_bad_input(encoder: SentenceEncoder) -> None:
    with pytest.raises(InputError, match="sentence 1"):
        encoder.encode(["ok", "  "], poolings=["mean"])
    with pytest.raises(InputError):
        encoder.encode(["ok"], poolings=[])
    with pytest.raises(InputError, match="out of range"):
        encoder.encode(["ok"], poolings=["0,9"])


def test_embed_cached_encodes_each_distinct_sentence_once(encoder: SentenceEncoder, tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path / "cache")
    sizes = _count_forwards(encoder)
    first = embed_cached(encoder, SENTENCES, ["mean", "cls"], cache=cache, batch_size=4)
    assert sum(sizes) == len(set(SENTENCES)) == 6  # the duplicate is encoded once, both poolings in one pass
    assert first["mean"].shape == (7, encoder.dim) and first["mean"].dtype == np.float32
    np.testing.assert_array_equal(first["cls"][1], first["cls"][6])

    sizes.clear()
    again = embed_cached(encoder, list(reversed(SENTENCES)), ["cls", "mean"], cache=cache)
    assert sizes == []  # everything came from disk
    np.testing.assert_array_equal(again["mean"], first["mean"][::-1])
    np.testing.assert_array_equal(again["cls"], first["cls"][::-1])

    # A new sentence and a new pooling: only what is missing is encoded, still in one pass.
    sizes.clear()
    more = embed_cached(encoder, [*SENTENCES, "a brand new one"], ["mean", "first-last-avg"], cache=cache)
    assert sum(sizes) == 7  # 6 sentences lack first-last-avg, the new one lacks both: 7 distinct, one pass
    np.testing.assert_array_equal(more["mean"][:7], first["mean"])
    fresh = encoder.encode([*SENTENCES, "a brand new one"], poolings=["first-last-avg"])["first-last-avg"]
    np.testing.assert_allclose(more["first-last-avg"], fresh, atol=1e-5)


def test_layer_list_poolings_are_cached_and_read_back(encoder: SentenceEncoder, tmp_path: Path) -> None:
    """A layer list ([0, 2], "1") is stored under its key ("layers-0-2") and found again by the same spec."""
    cache = EmbeddingCache(tmp_path / "cache")
    sizes = _count_forwards(encoder)
    first = embed_cached(encoder, SENTENCES, [[0, 2], "1"], cache=cache)
    assert set(first) == {"layers-0-2", "layers-1"} and sum(sizes) == 6
    sizes.clear()
    again = embed_cached(encoder, SENTENCES, ["0,2", [1]], cache=cache)
    assert sizes == []
    np.testing.assert_array_equal(again["layers-0-2"], first["layers-0-2"])
    fresh = encoder.encode(SENTENCES, poolings=[[0, 2]])["layers-0-2"]
    np.testing.assert_allclose(first["layers-0-2"], fresh, atol=1e-5)


def test_cache_layout_and_keys(encoder: SentenceEncoder, tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    embed_cached(encoder, SENTENCES[:3], ["mean"], cache=cache)
    folder = cache.folder(encoder, "mean")
    assert folder.parent.name.endswith(f"{encoder.fingerprint()}--{encoder.tokenizer_fingerprint()}")
    assert folder.name == "mean--len64--float32"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["dim"] == encoder.dim and meta["pooling"] == "mean" and meta["max_length"] == 64
    (keys_file,) = folder.glob("*.keys.json")
    assert json.loads(keys_file.read_text()) == [sentence_key(s) for s in SENTENCES[:3]]
    # Another max_length is another folder: its truncation gives other vectors.
    short = SentenceEncoder(
        encoder.model_id, pooling="mean", max_length=4, device="cpu", model=encoder.model, tokenizer=encoder.tokenizer
    )
    assert cache.folder(short, "mean") != folder
    _, found = cache.lookup(short, "mean", SENTENCES[:3])
    assert not found.any()


def test_broken_or_incomplete_shards_are_ignored(
    encoder: SentenceEncoder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EmbeddingCache(tmp_path)
    good = embed_cached(encoder, SENTENCES[:2], ["mean"], cache=cache)["mean"]
    folder = cache.folder(encoder, "mean")
    # A shard whose keys file was never written (interrupted) and one whose keys disagree with its rows.
    np.save(folder / "00000000000000000001-1.npy", np.ones((1, encoder.dim), dtype=np.float32))
    np.save(folder / "00000000000000000002-1.npy", np.ones((1, encoder.dim), dtype=np.float32))
    (folder / "00000000000000000002-1.keys.json").write_text(json.dumps([sentence_key(SENTENCES[0])] * 2))
    with caplog.at_level(logging.WARNING, logger="bertflow.evaluation.cache"):
        emb, found = cache.lookup(encoder, "mean", SENTENCES[:2])
    assert found.all()
    np.testing.assert_array_equal(emb, good)
    assert "ignoring shard" in caplog.text


def test_store_checks_shape(encoder: SentenceEncoder, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="shape"):
        EmbeddingCache(tmp_path).store(encoder, "mean", ["a", "b"], np.zeros((1, encoder.dim)))


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x"
    assert EmbeddingCache().root == tmp_path / "x"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir() == Path("~/.cache/bertflow/embeddings").expanduser()


def test_a_model_retrained_into_the_same_folder_misses_the_cache(
    working_tiny_bert: Path,  # noqa: F811 - fixture
    tmp_path: Path,
) -> None:
    """Only a deep layer changes (same folder, config, vocabulary and embeddings): the cache must not return the old
    model's vectors, it encodes again and gets the new model's."""
    import shutil

    import torch
    from transformers import BertModel

    folder = tmp_path / "model"
    shutil.copytree(working_tiny_bert, folder)
    cache = EmbeddingCache(tmp_path / "cache")
    old = embed_cached(SentenceEncoder(str(folder), device="cpu"), SENTENCES, ["mean"], cache=cache)["mean"]

    model = BertModel.from_pretrained(str(folder))
    with torch.no_grad():
        model.encoder.layer[-1].output.dense.weight.mul_(1.5)
    model.save_pretrained(str(folder))  # "retrained" in place
    retrained = SentenceEncoder(str(folder), device="cpu")
    sizes = _count_forwards(retrained)
    new = embed_cached(retrained, SENTENCES, ["mean"], cache=cache)["mean"]
    assert sum(sizes) == len(set(SENTENCES))  # nothing came from the cache
    np.testing.assert_allclose(new, retrained.encode(SENTENCES), atol=1e-5)
    assert np.abs(new - old).max() > 1e-3


def test_weighted_poolings_are_cached_per_token_statistics(encoder: SentenceEncoder, tmp_path: Path) -> None:
    """A weighted pooling's vectors depend on the token counts: other counts are a cache miss, never a stale hit."""
    cache = EmbeddingCache(tmp_path / "cache")
    encoder.token_statistics = encoder.count_tokens(SENTENCES)
    first = embed_cached(encoder, SENTENCES, ["sif:mean", "mean"], cache=cache)
    np.testing.assert_array_equal(first["sif-mean"], encoder.encode(SENTENCES, poolings=["sif:mean"])["sif-mean"])
    encoder.token_statistics = encoder.count_tokens(SENTENCES[:2])
    second = embed_cached(encoder, SENTENCES, ["sif:mean", "mean"], cache=cache)
    expected = encoder.encode(SENTENCES, poolings=["sif:mean"])["sif-mean"]
    np.testing.assert_array_equal(second["sif-mean"], expected)
    assert not np.array_equal(second["sif-mean"], first["sif-mean"])
    np.testing.assert_array_equal(second["mean"], first["mean"])
    assert len({p.name for p in cache.root.rglob("*--len*") if p.is_dir() and p.name.startswith("sif-mean")}) == 2
