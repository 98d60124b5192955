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


def warm_up(encoder: SentenceEncoder) -> None:
    """Encode :data:`WARM_UP_SENTENCES` sentences of random token ids as one chunk (results dropped,
    :attr:`~.encoder.SentenceEncoder.last_stats` untouched)."""
    n = WARM_UP_SENTENCES
    lengths = 2 + np.arange(n) % (encoder.max_length - 1)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.random.default_rng(0).integers(0, encoder.vocab_size, size=int(offsets[-1]), dtype=np.int32)
    # A weighted pooling may have no token statistics yet: the warm-up then runs the same forward with "mean".
    poolings = ["mean"] if encoder.pooling.weighting.weighted else None
    stats = encoder.last_stats
    for _ in encoder.iter_encode(TokenArrays(ids, offsets), chunk_size=n, poolings=poolings):
        pass
    encoder.last_stats = stats
