"""Tokenisation into flat arrays: TokenArrays and tokenize_arrays, with and without the WordPiece shortcut."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from bertflow.encoding.tokenization import GC_ENABLED, TokenArrays, tokenize_arrays
from bertflow.encoding.wordpiece import WordPieceShortcut

from ..conftest import SENTENCES
from .test_wordpiece import _fuzz, _rust


def _split(tokens: TokenArrays) -> list[list[int]]:
    return [tokens.ids[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]


def test_concatenate_joins_in_order():
    a = TokenArrays(np.array([1, 2, 3], np.int32), np.array([0, 2, 3]))
    b = TokenArrays(np.array([4, 5], np.int32), np.array([0, 0, 2]))  # an empty sentence, then two tokens
    joined = TokenArrays.concatenate([a, b])
    assert _split(joined) == [[1, 2], [3], [], [4, 5]]
    assert joined.lengths.tolist() == [2, 1, 0, 2]


def test_overlapping_tokenisations_keep_the_collector_paused(tiny_model_dir):
    """A tokenisation that ends while another is still running leaves the garbage collector paused for it."""
    rust = _rust(tiny_model_dir)

    class Overlapped:  # another thread starts tokenising while this call is inside the tokenizer
        def encode_batch(self, items, add_special_tokens):
            GC_ENABLED.hold(False)
            return rust.encode_batch(items, add_special_tokens=add_special_tokens)

    assert gc.isenabled()
    try:
        assert len(tokenize_arrays(Overlapped(), SENTENCES)) == len(SENTENCES)
        assert not gc.isenabled()  # the other tokenisation is still running
    finally:
        GC_ENABLED.release()
    assert gc.isenabled()


def test_tokenize_arrays_with_shortcut_equals_without(tiny_model_dir):
    tok = _rust(tiny_model_dir, 10)
    sentences = _fuzz(300)
    plain = tokenize_arrays(tok, sentences)
    fast = tokenize_arrays(tok, sentences, WordPieceShortcut.from_tokenizer(tok))
    np.testing.assert_array_equal(fast.offsets, plain.offsets)
    np.testing.assert_array_equal(fast.ids, plain.ids)


@pytest.mark.parametrize(
    "sentences",
    [[], ["café", "naïve résumé"], ["a [MASK] b"], ["plain words", "café", "more plain words", "[CLS] x"], ["", ""]],
)
def test_tokenize_arrays_with_shortcut_edge_lists(tiny_model_dir, sentences):
    """Lists the shortcut handles none, some or all of (or that are empty) give the tokenizer's arrays."""
    tok = _rust(tiny_model_dir, 10)
    plain = tokenize_arrays(tok, sentences)
    fast = tokenize_arrays(tok, sentences, WordPieceShortcut.from_tokenizer(tok))
    assert fast.ids.dtype == np.int32 and fast.offsets.dtype == np.int64 and len(fast) == len(sentences)
    np.testing.assert_array_equal(fast.offsets, plain.offsets)
    np.testing.assert_array_equal(fast.ids, plain.ids)
