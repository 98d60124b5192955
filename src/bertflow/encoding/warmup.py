"""Paying a CUDA encoder's one-time costs when it is loaded, not in its first encode (``EncodeSettings.warm_up``).

A process's first encode pays for what no later one does: the unpadded forward's first batch is checked against
the padded one, kernels are compiled or loaded, the CUDA and pinned-memory caches grow. :func:`warm_up` pays these
on synthetic token ids (never user text) through the encoder's own forward. It starts no tokenisation worker
processes (the first encode of more than one chunk still does): an encoder that only ever sees single chunks
(queries) never needs them. Off by default: docs/performance.md gives what it costs and what it buys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .tokenization import TokenArrays

if TYPE_CHECKING:
    from .encoder import SentenceEncoder

#: Synthetic sentences encoded (one chunk), their lengths cycling through 2 .. ``max_length``.
WARM_UP_SENTENCES = 8192


def synthetic_tokens(n: int, max_length: int, vocab_size: int, seed: int = 0) -> TokenArrays:
    """``n`` sentences of random token ids in ``[0, vocab_size)``, their lengths cycling through 2 .. ``max_length``."""
    lengths = 2 + np.arange(n) % (max_length - 1)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.random.default_rng(seed).integers(0, vocab_size, size=int(offsets[-1]), dtype=np.int32)
    return TokenArrays(ids, offsets)


def warm_up(encoder: SentenceEncoder) -> None:
    """Encode :data:`WARM_UP_SENTENCES` :func:`synthetic_tokens` as one chunk (results dropped)."""
    n = WARM_UP_SENTENCES
    # A weighted pooling may have no token statistics yet: the warm-up then runs the same forward with "mean".
    poolings = ["mean"] if encoder.pooling.weighting.weighted else None
    tokens = synthetic_tokens(n, encoder.max_length, encoder.vocab_size)
    for _ in encoder.iter_encode(tokens, chunk_size=n, poolings=poolings):
        pass
