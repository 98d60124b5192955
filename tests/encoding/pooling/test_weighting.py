"""Token weightings against hand computations on a three-sentence corpus, and weighted encoding end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding.pooling import Weighting
from bertflow.encoding.pooling.weighting import usif_a
from bertflow.encoding.token_stats import TokenStatistics

CORPUS = ["the man", "the dog", "a man plays music"]


@pytest.fixture(scope="module")
def encoder(tiny_model_dir) -> SentenceEncoder:
    return SentenceEncoder(str(tiny_model_dir), pooling="sif:mean", device="cpu")


def hand_counts(encoder: SentenceEncoder) -> tuple[dict[int, int], dict[int, int]]:
    """Occurrences and sentences per id, counted with plain Python over the tokenizer's output."""
    counts: dict[int, int] = {}
    df: dict[int, int] = {}
    for ids in encoder.tokenize(CORPUS):
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
        for t in set(ids):
            df[t] = df.get(t, 0) + 1
    return counts, df


def test_sif_and_idf_weights_equal_a_hand_computation(encoder):
    stats = encoder.count_tokens(CORPUS)
    counts, df = hand_counts(encoder)
    cls_id, the = encoder.tokenizer.cls_token_id, encoder.tokenizer.convert_tokens_to_ids("the")
    assert counts[cls_id] == 3 and counts[the] == 2 and sum(counts.values()) == 14  # [CLS] counted like a word
    assert stats.n_sentences == 3 and stats.n_tokens == 14
    sif = Weighting.parse("sif").table(stats)
    idf = Weighting.parse("idf").table(stats)
    for t in range(encoder.vocab_size):
        p = counts.get(t, 0) / 14
        assert sif[t] == pytest.approx(1e-3 / (1e-3 + p), rel=1e-6)
        assert idf[t] == pytest.approx(math.log(4 / (1 + df.get(t, 0))) + 1, rel=1e-6)
    assert sif[the] == pytest.approx(1e-3 / (1e-3 + 2 / 14), rel=1e-6)
    assert Weighting.parse("sif-0.01").table(stats)[the] == pytest.approx(0.01 / (0.01 + 2 / 14), rel=1e-6)


def test_idf_is_scikit_learns_smooth_idf(encoder):
    from scipy.sparse import csr_matrix
    from sklearn.feature_extraction.text import TfidfTransformer

    stats = encoder.count_tokens(CORPUS)
    rows = [np.bincount(ids, minlength=encoder.vocab_size) for ids in encoder.tokenize(CORPUS)]
    reference = TfidfTransformer(smooth_idf=True).fit(csr_matrix(np.array(rows))).idf_
    np.testing.assert_allclose(Weighting.parse("idf").table(stats), reference, rtol=1e-6)


def test_usif_weights_follow_ethayarajh_2018():
    # 10 ids: one very frequent, five middling, four rare; 20 sentences of 4.5 tokens on average.
    counts = np.array([40, 10, 10, 10, 10, 5, 2, 1, 1, 1, 0])
    stats = TokenStatistics(counts, np.minimum(counts, 20), 20)
    v, n = 10, 90 / 20
    threshold = 1 - (1 - 1 / v) ** n
    probs = counts / 90
    alpha = sum(1 for c in counts if c and c / 90 > threshold) / v
    a = (1 - alpha) / (alpha * v / 2)
    assert usif_a(stats) == pytest.approx(a)
    table = Weighting.parse("usif").table(stats)
    for t in range(10):
        assert table[t] == pytest.approx(a / (a / 2 + probs[t]), rel=1e-6)
    assert table[10] == pytest.approx(a / (a / 2 + 1 / 90), rel=1e-6)  # never seen: the rarest probability


def test_usif_refuses_statistics_that_cannot_give_its_a(encoder):
    with pytest.raises(InputError, match="uSIF cannot derive"):
        Weighting.parse("usif").table(encoder.count_tokens(CORPUS))


def test_weighted_encoding_uses_the_weights_and_needs_statistics(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), pooling="sif:mean", device="cpu")
    with pytest.raises(InputError, match="no token statistics"):
        enc.encode(CORPUS)
    assert enc.get_config()["token_statistics"] is None
    enc.token_statistics = enc.count_tokens(CORPUS)
    got = enc.encode(CORPUS)
    assert enc.get_config()["token_statistics"] == enc.token_statistics.digest()
    table = torch.from_numpy(Weighting.parse("sif").table(enc.token_statistics))
    for sentence, row in zip(CORPUS, got, strict=True):
        batch = enc.tokenizer([sentence], return_tensors="pt")
        with torch.no_grad():
            h = enc.model(**batch).last_hidden_state[0]
        w = table[batch["input_ids"][0]]
        np.testing.assert_allclose(row, ((w[:, None] * h).sum(0) / w.sum()).numpy(), atol=1e-5)
    plain = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu").encode(CORPUS)
    assert not np.allclose(got, plain, atol=1e-3)
    with pytest.raises(InputError, match="token ids"):
        enc.token_statistics = TokenStatistics.empty(enc.vocab_size + 1)
