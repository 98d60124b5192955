"""The warm-up at load (encoding/warmup.py, ``EncodeSettings.warm_up``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding import settings as settings_module
from bertflow.encoding import warmup
from bertflow.encoding.packed import max_cosine_deviation
from bertflow.encoding.settings import EncodeSettings

from ..conftest import SENTENCES, make_tiny_bert


def test_warm_up_setting():
    """On when asked for, off when not, on CUDA by the measured default; anything but None/True/False refused."""
    s = EncodeSettings()
    assert not s.warms_up("cpu") and dataclasses.replace(s, warm_up=True).warms_up("cpu")
    assert s.warms_up("cuda") == settings_module.WARM_UP_BY_DEFAULT
    assert not dataclasses.replace(s, warm_up=False).warms_up("cuda")
    with pytest.raises(InputError, match="warm_up"):
        EncodeSettings(warm_up=1)


def test_synthetic_tokens_cycle_through_every_length_within_the_vocabulary():
    tokens = warmup.synthetic_tokens(130, max_length=8, vocab_size=50, seed=1)
    assert len(tokens) == 130 and tokens.lengths.tolist()[:8] == [2, 3, 4, 5, 6, 7, 8, 2]
    assert tokens.ids.min() >= 0 and tokens.ids.max() < 50 and len(tokens.ids) == tokens.lengths.sum()
    again = warmup.synthetic_tokens(130, max_length=8, vocab_size=50, seed=1)
    assert np.array_equal(again.ids, tokens.ids)  # seeded: the same ids every time


def test_warm_up_changes_nothing_the_caller_sees(tiny_model_dir, monkeypatch):
    """An encoder warmed up at load gives the same vectors, and its stats are those of the caller's own encodes."""
    plain = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu", tokenize_workers=0)
    monkeypatch.setattr(warmup, "WARM_UP_SENTENCES", 128)
    calls = []
    runner_forward = type(plain._runner).forward

    def counting(self, batch, *a, **k):
        calls.append(batch.rows)
        return runner_forward(self, batch, *a, **k)

    monkeypatch.setattr(type(plain._runner), "forward", counting)
    warmed = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu", settings=EncodeSettings(warm_up=True))
    assert sum(calls) == 128  # the synthetic sentences went through the forward at load
    assert warmed.last_stats.sentences == 0 and warmed.chunk_tokenizer.pool is None  # no worker processes started
    np.testing.assert_allclose(warmed.encode(SENTENCES), plain.encode(SENTENCES), rtol=1e-5, atol=1e-6)
    assert warmed.last_stats.sentences == len(SENTENCES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_warm_up_checks_the_unpadded_forward_at_load_cuda(tmp_path):
    """On CUDA the warm-up runs the unpadded forward's check against the padded one at load, on synthetic ids,
    and the warmed encoder's vectors equal a cold one's (1 - cos <= 1e-3 in bf16)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = make_tiny_bert(tmp_path / "m", seed=7, hidden=128, layers=3)
    tok = BertTokenizerFast.from_pretrained(folder)
    torch.manual_seed(7)
    model = BertModel(BertConfig.from_pretrained(folder))
    sentences = [f"{s} {i}" for i in range(400) for s in SENTENCES]
    cold = SentenceEncoder("m", model=model, tokenizer=tok, device="cuda", settings=EncodeSettings(warm_up=False))
    assert not cold._runner.packed_verified
    reference = torch.from_numpy(cold.encode(sentences))
    warm = SentenceEncoder("m", model=model, tokenizer=tok, device="cuda", settings=EncodeSettings(warm_up=True))
    assert warm._runner.packed_verified and warm._runner.unpadded_refused is None
    assert max_cosine_deviation(torch.from_numpy(warm.encode(sentences)), reference) <= 1e-3
