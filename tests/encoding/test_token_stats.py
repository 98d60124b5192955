"""TokenStatistics: counts from token arrays, sums, and a bit-identical save/load round trip."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import InputError
from bertflow.encoding.token_stats import STATS_ARRAYS, STATS_CONFIG, TokenStatistics
from bertflow.encoding.tokenization import TokenArrays
from bertflow.errors import ModelFileError


def arrays(*sentences: list[int]) -> TokenArrays:
    offsets = np.cumsum([0, *map(len, sentences)])
    return TokenArrays(np.array([t for s in sentences for t in s], dtype=np.int32), offsets.astype(np.int64))


def test_counts_and_document_frequencies():
    stats = TokenStatistics.from_tokens(arrays([2, 5, 5, 3], [2, 7, 3], [2, 5, 3]), vocab_size=8)
    assert stats.counts.tolist() == [0, 0, 3, 3, 0, 3, 0, 1]
    assert stats.document_frequency.tolist() == [0, 0, 3, 3, 0, 2, 0, 1]
    assert (stats.n_sentences, stats.n_tokens, stats.vocab_size) == (3, 10, 8)
    np.testing.assert_allclose(stats.probabilities()[5], 0.3)
    with pytest.raises(ValueError):
        stats.counts[0] = 1  # read-only: what a model's weights come from never changes behind its back
    with pytest.raises(InputError, match="outside the vocabulary"):
        TokenStatistics.from_tokens(arrays([9]), vocab_size=8)


def test_sum_of_parts_equals_counting_everything():
    a, b = arrays([2, 5, 3]), arrays([2, 5, 5, 3], [2, 6, 3])
    whole = TokenStatistics.from_tokens(TokenArrays.concatenate([a, b]), 8)
    assert TokenStatistics.from_tokens(a, 8) + TokenStatistics.from_tokens(b, 8) == whole
    with pytest.raises(InputError, match="same tokenizer"):
        _ = whole + TokenStatistics.empty(9)


def test_save_load_round_trip_is_bit_identical_and_checked(tmp_path):
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 1000, size=30522)
    stats = TokenStatistics(counts, np.minimum(counts, 500), 500)
    stats.save(tmp_path / "s")
    back = TokenStatistics.load(tmp_path / "s")
    assert back == stats and back.digest() == stats.digest()
    assert back.counts.dtype == np.int64 and np.array_equal(back.counts, stats.counts)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted([STATS_CONFIG, STATS_ARRAYS])
    other = TokenStatistics(counts + 1, np.minimum(counts, 500), 500)
    other.save(tmp_path / "o")
    (tmp_path / "o" / STATS_CONFIG).replace(tmp_path / "s" / STATS_CONFIG)  # config of other arrays
    with pytest.raises(ModelFileError, match="does not describe"):
        TokenStatistics.load(tmp_path / "s")
