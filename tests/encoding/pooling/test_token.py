"""cls and pooler: the same numbers as before poolings were stages, bit for bit."""

from __future__ import annotations

import torch

from bertflow import SentenceEncoder
from bertflow.encoding.pooling import Pooling

from ...conftest import SENTENCES


def test_cls_and_pooler_equal_the_old_formula_exactly(tiny_encoder: SentenceEncoder):
    batch = tiny_encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        outputs = tiny_encoder.model(**batch)
    mask = batch["attention_mask"].bool()
    last, pooler_output = outputs.last_hidden_state.float(), outputs.pooler_output.float()
    states = {tiny_encoder.num_layers: last, "pooler_output": pooler_output}
    cls = Pooling.parse("cls", tiny_encoder.num_layers)
    pooler = Pooling.parse("pooler", tiny_encoder.num_layers)
    assert torch.equal(cls.pool(states, mask), outputs.last_hidden_state[:, 0].float())
    assert torch.equal(pooler.pool(states, mask), outputs.pooler_output.float())
    assert pooler.inputs == ("pooler_output",) and cls.layers == (tiny_encoder.num_layers,)
