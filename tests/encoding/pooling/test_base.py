"""Pooling specs, the registry (a toy pooling added by defining a class) and the masked mean."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding.pooling import Pooling, Weighting, base, masked_mean, pooling_names

from ...conftest import SENTENCES


@pytest.mark.parametrize(
    ("spec", "name", "layers", "key"),
    [
        ("mean", "mean", (6,), "mean"),
        ("cls", "cls", (6,), "cls"),
        ("pooler", "pooler", (), "pooler"),
        ("first-last-avg", "first-last-avg", (1, 6), "first-last-avg"),
        ("first_last_avg", "first-last-avg", (1, 6), "first-last-avg"),
        ("last2avg", "last2avg", (5, 6), "last2avg"),
        ("1,-1", "layers", (1, 6), "layers-1-6"),
        ([0, -1], "layers", (0, 6), "layers-0-6"),
        ([-7], "layers", (0,), "layers-0"),
        ("sif:first-last-avg", "sif:first-last-avg", (1, 6), "sif-first-last-avg"),
        ("SIF-3e-4:mean", "sif-0.0003:mean", (6,), "sif-0.0003-mean"),
        ("idf:1,-1", "idf:layers", (1, 6), "idf-layers-1-6"),
        ("usif:last2avg", "usif:last2avg", (5, 6), "usif-last2avg"),
        ("none:mean", "mean", (6,), "mean"),
    ],
)
def test_parse_name_layers_key_and_round_trip(spec, name, layers, key):
    p = Pooling.parse(spec, num_layers=6)
    assert (p.name, p.layers, p.key) == (name, layers, key)
    assert Pooling.parse(p.to_spec(), 6) == p


def test_unweighted_specs_keep_their_json_form():
    assert Pooling.parse("first-last-avg", 6).to_spec() == "first-last-avg"
    assert Pooling.parse("1,-1", 6).to_spec() == [1, 6]
    assert Pooling.parse("sif:1,-1", 6).to_spec() == "sif:1,6"
    assert Pooling.parse("sif:mean", 6).weighting == Weighting("sif", 1e-3)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("max", "unknown pooling"),
        ([7], "out of range"),
        ([-8], "out of range"),
        ([], "empty"),
        ("sif:cls", "average tokens"),
        ("idf:pooler", "average tokens"),
        ("tfidf:mean", "unknown weighting"),
        ("sif-0:mean", "positive"),
        ("sif-x:mean", "positive"),
        ("idf-3:mean", "unknown weighting"),
    ],
)
def test_parse_errors(spec, match):
    with pytest.raises(InputError, match=match):
        Pooling.parse(spec, num_layers=6)


def test_masked_mean_ignores_padding_and_weights_tokens():
    states = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    before = masked_mean(states, mask)
    states[0, 3:] = 1e6  # garbage in padded positions must not leak
    after = masked_mean(states, mask)
    torch.testing.assert_close(before, after)
    torch.testing.assert_close(after[0], states[0, :3].mean(0))
    weights = torch.tensor([[0.5, 2.0, 1.0, 7.0, 9.0], [1.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    weighted = masked_mean(states, mask, weights)
    expected = (0.5 * states[0, 0] + 2.0 * states[0, 1] + states[0, 2]) / 3.5
    torch.testing.assert_close(weighted[0], expected)
    torch.testing.assert_close(weighted[1], states[1].mean(0))  # equal weights: the plain mean


def test_a_pooling_is_one_class(tiny_model_dir, monkeypatch):
    """Defining a Pooling subclass registers it: SentenceEncoder then takes its name, alone or weighted."""
    monkeypatch.setattr(base, "_REGISTRY", list(base._REGISTRY))  # the toy leaves the registry as it was

    @dataclass(frozen=True)
    class MaxPooling(Pooling):
        top: int
        weights_used: Weighting = Weighting()
        names = ("toy-max",)

        @property
        def layers(self) -> tuple[int, ...]:
            return (self.top,)

        @property
        def base_name(self) -> str:
            return "toy-max"

        def base_spec(self) -> str:
            return "toy-max"

        @classmethod
        def build(cls, name: str, num_layers: int, weighting: Weighting) -> Pooling | None:
            return cls(num_layers) if name == "toy-max" else None

        def pool(
            self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
        ) -> torch.Tensor:
            h = states[self.top].masked_fill(~mask.bool().unsqueeze(-1), float("-inf"))
            return h.max(dim=1).values

    assert "toy-max" in pooling_names()
    enc = SentenceEncoder(str(tiny_model_dir), pooling="toy-max", device="cpu")
    assert enc.pooling == MaxPooling(3) and enc.get_config()["pooling"] == "toy-max"
    got = enc.encode(SENTENCES[:3])
    batch = enc.tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        last = enc.model(**batch).last_hidden_state
    manual = last.masked_fill(batch["attention_mask"][..., None] == 0, float("-inf")).amax(dim=1).numpy()
    np.testing.assert_allclose(got, manual, atol=1e-5)
    with pytest.raises(InputError, match="average tokens"):
        SentenceEncoder(str(tiny_model_dir), pooling="sif:toy-max", device="cpu")
