"""ModelRunner (encoding/forward.py): which forward a setting takes, and the automatic unpadded path's check of its
first batch against the padded forward."""

from __future__ import annotations

import dataclasses

import numpy as np

from bertflow import SentenceEncoder
from bertflow.encoding import forward as forward_module
from bertflow.encoding.packed import ATTENTIONS, padded_attention
from bertflow.encoding.settings import EncodeSettings

from ..conftest import SENTENCES


def test_runner_batches_freely_only_for_the_packed_layout(tiny_model_dir):
    """Without the attention kernels (CPU) the CUDA attention is the slotted one, whose batches pay for padding;
    the packed layout (unpadded=True off CUDA: padded attention on real tokens) does not, the padded forward does."""
    runner = SentenceEncoder(str(tiny_model_dir), device="cpu")._runner
    assert runner.cuda_attention is ATTENTIONS["slotted"]
    assert not runner.padding_free(None) and not runner.padding_free(False)
    assert runner.padding_free(True)


def test_automatic_path_checks_its_first_batch(tiny_model_dir, monkeypatch):
    """The automatic (CUDA) path is taken only after its first batch matched the padded forward."""
    sentences = SENTENCES * 2
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", settings=EncodeSettings(unpadded=False))
    ref = enc.encode(sentences)
    runner = enc._runner
    enc.settings = dataclasses.replace(enc.settings, unpadded=None)
    runner.half_cuda = True  # pretend this is CUDA in half precision, with a stand-in attention
    monkeypatch.setattr(forward_module, "UNPADDED_BY_DEFAULT", True)
    runner.cuda_attention = padded_attention
    np.testing.assert_allclose(enc.encode(sentences), ref, rtol=1e-5, atol=1e-5)
    assert runner.packed_verified and runner.unpadded_refused is None

    def wrong(q, k, v, packing):  # a broken kernel: other tokens' values, scaled (a tiny random BERT's
        return v.flip(0) * 100  # attention barely moves its output, so the error must be large to show)

    runner.packed_verified = False
    runner.cuda_attention = wrong
    np.testing.assert_allclose(enc.encode(sentences), ref, rtol=1e-5, atol=1e-5)  # padded results, not wrong ones
    assert "deviated from the padded forward" in runner.unpadded_refused
    assert runner.packed_attention(None) is None
