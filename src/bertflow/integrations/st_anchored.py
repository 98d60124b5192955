"""Anchored whitening and ``auto`` as sentence-transformers' own modules, after a token-averaging pooling.

Both calibrators output ``[sqrt(1-b) x/|x|, sqrt(b) z/|z|]`` with ``z = (x - mean) W``: two blocks of one vector,
each normalised on its own. A chain of built-in modules (sentence-transformers >= 6.2) computes it exactly when ``x``
is a (weighted) mean of token embeddings ``h_t``: ``Normalize`` writes ``x/|x|`` into ``cls_token_embeddings``, a
``Dense`` maps each token to ``(h_t - mean) W`` (an affine map commutes with the mean), ``HierarchicalTokenPooling``
with one cluster per sentence averages and normalises them (``z/|z|``), ``Pooling(("cls", "max"))`` concatenates
the two blocks and a diagonal ``Dense`` scales them. The saved folder loads with plain ``SentenceTransformer(path)``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ..calibrators import Calibrator
from ..encoding.encoder import SentenceEncoder
from ..portability import anchored_parts

try:  # sentence-transformers >= 6.2: Dense and Normalize read and write any feature key
    from sentence_transformers.base.modules import Dense, Module, Normalize
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling
    from sentence_transformers.sentence_transformer.modules import Pooling, WeightedLayerPooling, WordWeights
except ImportError:  # pragma: no cover - older sentence-transformers: no such export
    HierarchicalTokenPooling = None


#: Above any sentence's token count: HierarchicalTokenPooling then keeps one cluster per sentence.
_ONE_CLUSTER = 1e9


def anchored_modules(calibrator: Calibrator, encoder: SentenceEncoder, pooling: list[Module]) -> list[Module] | None:
    """The modules that follow ``pooling`` (:func:`~.st_export.pooling_modules` of ``encoder``) to compute
    ``calibrator`` (anchored whitening or auto), or ``None`` for cls pooling or another calibrator: ``[Normalize,
    (WeightedLayerPooling,) Dense, (WordWeights,) HierarchicalTokenPooling, Pooling, Dense]``, whose output is
    ``calibrator.transform`` of the pooled vectors, [N, D + k], to float32 rounding.
    """
    parts = anchored_parts(calibrator)
    if parts is None or HierarchicalTokenPooling is None or encoder.pooling.base_name == "cls":
        return None
    mean, W, b = parts
    d, k = W.shape
    identity = torch.nn.Identity()
    layers = [m for m in pooling if isinstance(m, WeightedLayerPooling)]
    weights = [m for m in pooling if isinstance(m, WordWeights)]
    modules: list[Module] = [
        Normalize(module_input_name="sentence_embedding", module_output_name="cls_token_embeddings")
    ]
    if weights:
        # WordWeights left w_t h_t in token_embeddings; the centring needs w_t (h_t - mean): recompute h_t first.
        top = encoder.num_layers
        modules.append(
            copy.deepcopy(layers[0])
            if layers
            else WeightedLayerPooling(
                d, num_hidden_layers=top, layer_start=top, layer_weights=torch.nn.Parameter(torch.ones(1), False)
            )
        )
    modules.append(
        Dense(
            d,
            k,
            bias=True,
            activation_function=identity,
            init_weight=torch.from_numpy(np.ascontiguousarray(W.T, dtype=np.float32)),
            init_bias=torch.from_numpy((-(mean @ W)).astype(np.float32)),
            module_input_name="token_embeddings",
        )
    )
    modules += [copy.deepcopy(w) for w in weights]
    scale = np.concatenate([np.full(d, np.sqrt(1.0 - b)), np.full(k, np.sqrt(b))]).astype(np.float32)
    modules += [
        HierarchicalTokenPooling(
            _ONE_CLUSTER, num_protected_tokens=0, normalize_embeddings=True, tasks=["query", "document"]
        ),
        Pooling(k, ("cls", "max")),
        Dense(d + k, d + k, bias=False, activation_function=identity, init_weight=torch.diag(torch.from_numpy(scale))),
    ]
    return modules
