"""``auto`` cells of the grid and the per-set protocol: :func:`bertflow.paper.grid.fit_cell` fits the rule by
:func:`bertflow.autofit.fit_auto`, as ``Embedder.fit`` does, so a report's ``auto`` row is what ``bertflow fit
--calibrator auto`` would give.

The rule reads poolings besides the cell's own (``mean``, and the prior-weighted form of the pooling):
:func:`encode_auto_inputs` adds the weighted ones to the run's table under :func:`table_key` (``"<key>@prior"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..autofit import AutoInputs, auto_inputs
from ..encoding.encoder import SentenceEncoder
from ..encoding.pooling import Pooling
from ..evaluation.cache import EmbeddingCache, embed_cached

if TYPE_CHECKING:
    from .grid import EmbeddingTable


#: Table keys of prior-weighted poolings end with this (a pooling weighted by other counts has the plain key).
PRIOR_SUFFIX = "@prior"


def is_auto(spec: str) -> bool:
    """Whether a calibrator spec is the ``auto`` rule."""
    return spec.strip().lower() == "auto"


def table_key(inputs: AutoInputs, pooling: Pooling) -> str:
    """The table key of one of ``inputs``' poolings (the weighted one's marks its prior counts)."""
    return pooling.key + PRIOR_SUFFIX if pooling is inputs.weighted else pooling.key


def encode_auto_inputs(
    encoder: SentenceEncoder,
    poolings: Sequence[Pooling],
    sentences: Sequence[str],
    table: EmbeddingTable,
    *,
    cache: EmbeddingCache | None,
    batch_size: int | None,
) -> dict[str, AutoInputs]:
    """The :class:`AutoInputs` of each pooling (by key), after adding to ``table`` (which holds ``mean``, the token
    anisotropy's pooling: :func:`~bertflow.paper.grid.encode_table` encodes it in the same pass) the rows of
    ``sentences`` under each prior-weighted pooling, with the encoder's token statistics set to its prior while it
    encodes, then restored."""
    inputs = {p.key: auto_inputs(encoder, p) for p in poolings}
    for i in inputs.values():
        if i.weighted is None or i.prior is None or table_key(i, i.weighted) in table.embeddings:
            continue
        own_stats = encoder.token_statistics
        encoder.token_statistics = i.prior.statistics
        try:
            out = embed_cached(encoder, sentences, [i.weighted], cache=cache, batch_size=batch_size)
        finally:
            encoder.token_statistics = own_stats
        table.embeddings[table_key(i, i.weighted)] = out[i.weighted.key]
    return inputs
