"""Tokenisation into flat numpy arrays (:class:`TokenArrays`) with a ``tokenizers.Tokenizer``, optionally through
a :class:`~.wordpiece.WordPieceShortcut` (worker processes: :mod:`.tokenizer_pool`)."""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..resources import CountedSetting

if TYPE_CHECKING:
    from .wordpiece import WordPieceShortcut


@dataclass
class TokenArrays:
    """Token ids of a list of sentences: ``ids`` [total] int32, all sentences back to back; ``offsets`` [n+1]
    int64, sentence ``i`` is ``ids[offsets[i]:offsets[i+1]]`` (special tokens included, after truncation)."""

    ids: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """[n] token counts."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        """Number of sentences n."""
        return len(self.offsets) - 1

    def slice(self, start: int, stop: int) -> TokenArrays:
        """The token arrays of sentences ``start .. stop-1`` (a view of the ids; offsets rebased to 0)."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return TokenArrays(self.ids[lo:hi], self.offsets[start : stop + 1] - lo)

    @classmethod
    def concatenate(cls, parts: Sequence[TokenArrays]) -> TokenArrays:
        """The token arrays of consecutive lists of sentences, joined in order."""
        if len(parts) == 1:
            return parts[0]
        lengths = np.concatenate([p.lengths for p in parts])
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
        return cls(np.concatenate([p.ids for p in parts]), offsets)


#: Python's cyclic garbage collector (enabled or not), paused while any thread tokenises.
GC_ENABLED = CountedSetting(gc.isenabled, lambda on: gc.enable() if on else gc.disable())


def tokenize_arrays(tokenizer: Any, sentences: Sequence[str], shortcut: WordPieceShortcut | None = None) -> TokenArrays:
    """Token ids of ``sentences`` from a ``tokenizers.Tokenizer`` (set up to truncate, not pad) as flat arrays; the
    sentences a ``shortcut`` (built from the same tokenizer) handles skip the tokenizer, with the same ids."""
    items = list(sentences)
    # One Python list per sentence (or per word, in the shortcut): tens of thousands of allocations, which set off
    # the cyclic garbage collector, whose full passes over a large heap took up to 5x as long as the read-out itself
    # (measured on the GPU host). Lists of ints and strings cannot form cycles, so collection is paused here.
    with GC_ENABLED.held(False):
        if shortcut is not None:
            handled, flat, offsets = shortcut.arrays(items)
            rest = np.flatnonzero(~handled)
            if not len(rest):
                return TokenArrays(flat, offsets)
        # encode_batch_fast skips character offsets, which are never used (about 25% less tokenisation time).
        encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        chosen = [items[i] for i in rest] if shortcut is not None else items
        others = [e.ids for e in encode(chosen, add_special_tokens=True)]
    if shortcut is None:
        lengths = np.fromiter(map(len, others), dtype=np.int64, count=len(others))
        ids = np.fromiter(itertools.chain.from_iterable(others), dtype=np.int32, count=int(lengths.sum()))
        return TokenArrays(ids, np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)]))
    # Merge: the shortcut's sentences by one scatter, the tokenizer's (few: non-ASCII, added tokens) one by one.
    lengths = np.zeros(len(items), np.int64)
    lengths[handled] = np.diff(offsets)
    lengths[rest] = [len(ids) for ids in others]
    merged = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
    out = np.empty(int(merged[-1]), dtype=np.int32)
    shift = merged[:-1][handled] - offsets[:-1]
    out[np.repeat(shift, np.diff(offsets)) + np.arange(len(flat))] = flat
    for i, ids in zip(rest.tolist(), others, strict=True):
        out[merged[i] : merged[i + 1]] = ids
    return TokenArrays(out, merged)


def truncating_copy(tokenizer: Any, max_length: int) -> Any:
    """A copy of a Hugging Face fast ``tokenizer``'s Rust tokenizer that truncates to ``max_length`` tokens (special
    tokens included, on its ``truncation_side``) and never pads (a copy: those settings are state on the object)."""
    from tokenizers import Tokenizer

    rust = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    rust.no_padding()
    rust.enable_truncation(max_length, direction=getattr(tokenizer, "truncation_side", "right"))
    return rust


# The Rust tokenizer's own thread pool does the parallel work; keep it on (and quiet the fork warning in CLI
# subprocesses, which never tokenise before forking).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
