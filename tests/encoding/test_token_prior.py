"""The packaged token prior (encoding/token_prior.py): the shipped one matches the bert-base-uncased vocabulary."""

from __future__ import annotations

from bertflow import SentenceEncoder
from bertflow.encoding import token_prior


def test_the_shipped_prior_matches_the_bert_uncased_vocabulary(tiny_model_dir):
    priors = token_prior.available_priors()
    assert priors and all(p.statistics.n_sentences == 100_000 for p in priors)
    # A tokenizer with another vocabulary gets none (the tiny test model's vocabulary is not BERT's).
    encoder = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu")
    assert token_prior.prior_for(encoder.tokenizer) is None
