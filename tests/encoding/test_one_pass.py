"""One forward pass, any number of poolings: SentenceEncoder.encode / iter_encode with ``poolings``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder

from ..sts_layout import working_tiny_bert  # noqa: F401 - fixture (a tokenizer that knows its vocab)

SENTENCES = [
    "A man is playing a guitar.",
    "the cat sleeps on the mat",
    "Someone plays music.",
    "A plane is taking off from the airport runway while people watch and wave.",
    "zq xv wk",
    "the cat",
]
POOLINGS = ["mean", "cls", "pooler", "first-last-avg", "last2avg", [0, 2], "1"]
KEYS = ["mean", "cls", "pooler", "first-last-avg", "last2avg", "layers-0-2", "layers-1"]


@pytest.fixture()
def encoder(working_tiny_bert: Path) -> SentenceEncoder:  # noqa: F811
    return SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu", max_tokens=40, tokenize_workers=0)


def test_every_pooling_from_one_pass_equals_its_own_encoder(encoder: SentenceEncoder) -> None:
    calls: list[int] = []
    encoder.model.register_forward_pre_hook(
        lambda _m, args, kw: calls.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    out = encoder.encode(SENTENCES, poolings=POOLINGS)
    assert list(out) == KEYS and sum(calls) == len(SENTENCES)  # seven poolings, each sentence through the model once
    assert len(calls) == encoder.last_stats.batches > 1
    for spec, key in zip(POOLINGS, KEYS, strict=True):
        single = SentenceEncoder(
            encoder.model_id,
            pooling=spec,
            device="cpu",
            model=encoder.model,
            tokenizer=encoder.tokenizer,
            settings=encoder.settings,
        )
        # Same batches, same float32 pooling: the very same numbers, not just close ones.
        np.testing.assert_array_equal(out[key], single.encode(SENTENCES), err_msg=key)
        assert out[key].dtype == np.float32 and out[key].flags.c_contiguous
    assert np.abs(out["mean"] - out["cls"]).max() > 1e-3  # the poolings really differ


def test_streamed_poolings_come_as_dicts_in_input_order(encoder: SentenceEncoder) -> None:
    whole = encoder.encode(SENTENCES, poolings=["cls", "mean"])
    parts = list(encoder.iter_encode(iter(SENTENCES), chunk_size=4, poolings=["cls", "mean"]))
    assert [len(p["cls"]) for p in parts] == [4, 2]
    for key in ("cls", "mean"):
        np.testing.assert_allclose(np.concatenate([p[key] for p in parts]), whole[key], atol=1e-6)
    one = encoder.encode(SENTENCES[0], poolings=["cls"])
    np.testing.assert_allclose(one["cls"], whole["cls"][0], atol=1e-6)
    empty = encoder.encode([], poolings=["mean", "cls"])
    assert {k: v.shape for k, v in empty.items()} == {"mean": (0, encoder.dim), "cls": (0, encoder.dim)}


def test_bad_pooling_requests_are_refused(encoder: SentenceEncoder) -> None:
    with pytest.raises(InputError, match="at least one pooling"):
        encoder.encode(SENTENCES, poolings=[])
    with pytest.raises(InputError, match="must be a list of poolings"):
        encoder.encode(SENTENCES, poolings="mean")
    with pytest.raises(InputError, match="out of range"):
        encoder.encode(SENTENCES, poolings=["mean", [9]])
    with pytest.raises(InputError, match="applies to one pooling"):
        encoder.encode(SENTENCES, poolings=["mean", "cls"], transform=lambda x: x)


def test_a_transform_applies_to_a_single_requested_pooling(encoder: SentenceEncoder) -> None:
    weight = torch.randn(encoder.dim, 3, generator=torch.Generator().manual_seed(0))
    plain = encoder.encode(SENTENCES, poolings=["cls"])["cls"]
    moved = encoder.encode(SENTENCES, poolings=["cls"], transform=lambda x: x @ weight)
    assert list(moved) == ["cls"] and moved["cls"].shape == (len(SENTENCES), 3)
    np.testing.assert_allclose(moved["cls"], plain @ weight.numpy(), atol=1e-4)
