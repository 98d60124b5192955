"""Embedder.encode takes sentence-transformers' encode keywords with their meaning, and names any other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertflow import Embedder, FlowCalibrator, InputError, WhiteningCalibrator

from .conftest import SENTENCES

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]


@pytest.fixture(scope="module")
def fitted(tiny_encoder):
    return Embedder(tiny_encoder, WhiteningCalibrator(24)).fit(CORPUS)  # 24 dimensions out of 32


def test_default_is_a_float32_array(fitted):
    z = fitted.encode(SENTENCES, convert_to_numpy=True, show_progress_bar=False)
    assert isinstance(z, np.ndarray) and z.dtype == np.float32 and z.shape == (len(SENTENCES), 24)


def test_convert_to_tensor(fitted):
    z = fitted.encode(SENTENCES)
    t = fitted.encode(SENTENCES, convert_to_tensor=True)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device == fitted.encoder.device
    np.testing.assert_array_equal(t.numpy(), z)
    # convert_to_tensor wins over convert_to_numpy, as in sentence-transformers
    assert isinstance(fitted.encode(SENTENCES, convert_to_tensor=True, convert_to_numpy=True), torch.Tensor)
    one = fitted.encode("The cat sleeps.", convert_to_tensor=True)
    assert one.shape == (24,)


def test_convert_to_numpy_false_gives_a_list_of_tensors(fitted):
    z = fitted.encode(SENTENCES)
    rows = fitted.encode(SENTENCES, convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == len(SENTENCES)
    assert all(isinstance(r, torch.Tensor) and r.shape == (24,) for r in rows)
    np.testing.assert_array_equal(torch.stack(rows).numpy(), z)
    single = fitted.encode("The cat sleeps.", convert_to_numpy=False)
    assert isinstance(single, torch.Tensor) and single.shape == (24,)


def test_normalize_embeddings(fitted):
    z = fitted.encode(SENTENCES).astype(np.float64)
    u = fitted.encode(SENTENCES, normalize_embeddings=True)
    assert u.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(u, z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-6)
    one = fitted.encode("The cat sleeps.", normalize_embeddings=True)
    assert one.shape == (24,) and abs(np.linalg.norm(one) - 1) < 1e-6


def test_batch_size_and_progress_bar_reach_the_encoder(fitted, monkeypatch):
    seen = {}
    original = fitted.encoder.encode

    def spy(sentences, **kwargs):
        seen.update(kwargs)
        return original(sentences, **kwargs)

    monkeypatch.setattr(fitted.encoder, "encode", spy)
    fitted.encode(SENTENCES, batch_size=3, show_progress_bar=False)
    assert seen["batch_size"] == 3 and seen["show_progress_bar"] is False


def test_batch_size_does_not_change_results(fitted):
    # Other batch shapes reorder float32 sums in the encoder; whitening scales those differences up a little.
    np.testing.assert_allclose(fitted.encode(CORPUS, batch_size=3), fitted.encode(CORPUS), rtol=1e-4, atol=1e-4)


def test_device_must_be_the_encoders(fitted):
    np.testing.assert_array_equal(fitted.encode(SENTENCES, device="cpu"), fitted.encode(SENTENCES))
    np.testing.assert_array_equal(fitted.encode(SENTENCES, device=torch.device("cpu")), fitted.encode(SENTENCES))
    with pytest.raises(InputError, match=r"encodes on cpu, not cuda:1.*SentenceEncoder\(\.\.\., device='cuda:1'\)"):
        fitted.encode(SENTENCES, device="cuda:1")


def test_prompts_are_refused(fitted):
    for kwargs in ({"prompt": "query: "}, {"prompt_name": "query"}):
        with pytest.raises(InputError, match="takes no prompt"):
            fitted.encode(SENTENCES, **kwargs)
    fitted.encode(SENTENCES, prompt=None, prompt_name=None)  # the defaults are fine


def test_precision_quantises_like_sentence_transformers(fitted):
    quantization = pytest.importorskip("sentence_transformers.util.quantization")
    z = fitted.encode(SENTENCES)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        q = fitted.encode(SENTENCES, precision=precision)
        np.testing.assert_array_equal(q, quantization.quantize_embeddings(z, precision=precision))
    assert fitted.encode(SENTENCES, precision="binary").dtype == np.int8
    assert fitted.encode(SENTENCES, precision="binary").shape == (len(SENTENCES), 3)  # 24 bits packed
    with pytest.raises(InputError, match="precision must be one of .*got 'int4'"):
        fitted.encode(SENTENCES, precision="int4")


def test_unknown_keywords_are_named(fitted):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'colour', 'shape'; it takes") as e:
        fitted.encode(SENTENCES, shape="wide", colour="red")
    assert "\n" not in str(e.value)


def test_checks_come_before_the_work(tiny_encoder):
    """A bad keyword is reported even by an unfitted model: nothing is encoded first."""
    unfitted = Embedder(tiny_encoder, FlowCalibrator())
    with pytest.raises(TypeError, match="'colour'"):
        unfitted.encode(SENTENCES, colour="red")
    with pytest.raises(InputError, match="takes no prompt"):
        unfitted.encode(SENTENCES, prompt="query: ")
