"""Poolings that average token states over one or more layers: ``mean``, ``first-last-avg``, ``last2avg`` and
explicit hidden-state index lists, each optionally frequency-weighted (``sif:first-last-avg``).

The BERT-flow paper's "last2avg" is, in its code, the average of the first and last *transformer* layers
(``[1, L]``, our ``first-last-avg``); ports that wrote ``hidden_states[0]`` averaged the embedding layer instead,
which costs about 4 STS points. Our ``last2avg`` is the last two layers (``[L-1, L]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ...errors import InputError
from .base import Pooling, masked_mean
from .weighting import NO_WEIGHTING, Weighting

#: Named layer averages: name -> indices as a function of the number of layers L.
_NAMED = {
    "mean": lambda n: (n,),
    "first-last-avg": lambda n: (1, n),
    "first-last": lambda n: (1, n),
    "last2avg": lambda n: (n - 1, n),
}


@dataclass(frozen=True)
class LayerMeanPooling(Pooling):
    """The masked (optionally ``token_weighting``-weighted) mean over tokens of the average of the states at
    ``indices`` (``hidden_states`` indices, non-negative, sorted, distinct); ``kind`` is ``"mean"`` (layer L),
    ``"first-last-avg"`` (1 and L), ``"last2avg"`` (L-1 and L) or ``"layers"`` (the indices given)."""

    kind: str
    indices: tuple[int, ...]
    token_weighting: Weighting = NO_WEIGHTING
    names = ("mean", "first-last-avg", "last2avg")
    averages_tokens = True
    portable = True  # WeightedLayerPooling + WordWeights + Pooling "mean"

    @property
    def layers(self) -> tuple[int, ...]:
        return self.indices

    @property
    def weighting(self) -> Weighting:
        return self.token_weighting

    @property
    def base_name(self) -> str:
        return self.kind

    def base_spec(self) -> str | list[int]:
        return list(self.indices) if self.kind == "layers" else self.kind

    @classmethod
    def build(cls, name: str, num_layers: int, weighting: Weighting) -> LayerMeanPooling | None:
        if name in _NAMED:
            canonical = "first-last-avg" if name == "first-last" else name
            return cls(canonical, _NAMED[name](num_layers), weighting)
        parts = [p.strip() for p in name.split(",") if p.strip()]
        try:
            indices = [int(p) for p in parts]
        except ValueError:
            return None
        if not indices:
            raise InputError("pooling layer list is empty: give at least one hidden-state index")
        for i in indices:
            if not -(num_layers + 1) <= i <= num_layers:
                raise InputError(
                    f"pooling layer index {i} is out of range for a model with {num_layers} layers: "
                    f"valid hidden-state indices are 0 (embeddings) .. {num_layers} or -1 .. {-(num_layers + 1)}"
                )
        return cls("layers", tuple(sorted({i % (num_layers + 1) for i in indices})), weighting)

    def pool(
        self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        # Average the layers first, then take one masked mean: same result, one reduction over tokens.
        stacked = states[self.indices[0]]
        for i in self.indices[1:]:
            stacked = stacked + states[i]
        if len(self.indices) > 1:
            stacked = stacked / len(self.indices)
        return masked_mean(stacked, mask, weights if self.token_weighting.weighted else None)
