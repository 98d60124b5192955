"""Layer-average poolings (mean, first-last-avg, last2avg, index lists): the same numbers as the formula before
poolings were stages, bit for bit, and the weighted mean."""

from __future__ import annotations

import pytest
import torch

from bertflow import SentenceEncoder
from bertflow.encoding.pooling import Pooling

from ...conftest import SENTENCES


def old_formula(spec, outputs, mask: torch.Tensor) -> torch.Tensor:
    """bertflow's pooling arithmetic before this package: the last layer's masked mean for ``mean``; for layer
    lists the layers summed in index order, divided by their number, then one masked mean; float32 throughout."""

    def masked_mean(states):
        m = mask.unsqueeze(-1).to(states.dtype)
        return (states * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)

    if spec == "mean":
        return masked_mean(outputs.last_hidden_state.float())
    layers = Pooling.parse(spec, len(outputs.hidden_states) - 1).layers
    hidden = {i: outputs.hidden_states[i].float() for i in layers}
    stacked = hidden[layers[0]]
    for i in layers[1:]:
        stacked = stacked + hidden[i]
    return masked_mean(stacked / len(layers))


@pytest.mark.parametrize("spec", ["mean", "first-last-avg", "last2avg", [0, 2], [1], "0,1,3"])
def test_unweighted_poolings_equal_the_old_formula_exactly(tiny_encoder: SentenceEncoder, spec):
    batch = tiny_encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        outputs = tiny_encoder.model(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].bool()
    pooling = Pooling.parse(spec, tiny_encoder.num_layers)
    states = {i: outputs.hidden_states[i].float() for i in range(tiny_encoder.num_layers + 1)}
    states[tiny_encoder.num_layers] = outputs.last_hidden_state.float()
    assert torch.equal(pooling.pool(states, mask), old_formula(spec, outputs, mask))


def test_weighted_pooling_is_the_weighted_mean_of_the_layer_average(tiny_encoder: SentenceEncoder):
    pooling = Pooling.parse("sif:first-last-avg", tiny_encoder.num_layers)
    torch.manual_seed(0)
    states = {1: torch.randn(2, 4, 3, dtype=torch.float64), 3: torch.randn(2, 4, 3, dtype=torch.float64)}
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    weights = torch.tensor([[0.1, 0.5, 0.9, 100.0], [1.0, 0.2, 0.3, 0.4]], dtype=torch.float64)
    got = pooling.pool(states, mask, weights)
    avg = (states[1] + states[3]) / 2
    expected0 = (0.1 * avg[0, 0] + 0.5 * avg[0, 1] + 0.9 * avg[0, 2]) / 1.5
    torch.testing.assert_close(got[0], expected0)
    unweighted = Pooling.parse("first-last-avg", tiny_encoder.num_layers)
    assert not torch.equal(got, unweighted.pool(states, mask))
