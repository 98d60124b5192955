"""Poolings that read one vector per sentence: ``cls`` (the first token's last-layer state) and ``pooler``.

Neither averages tokens, so no token weighting applies to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .base import Pooling
from .weighting import Weighting


@dataclass(frozen=True)
class ClsPooling(Pooling):
    """The last layer's state of the first token ([CLS] for BERT), as sentence-transformers' ``cls`` mode."""

    num_layers: int
    names = ("cls",)
    portable = True  # sentence-transformers' Pooling "cls"

    @property
    def layers(self) -> tuple[int, ...]:
        return (self.num_layers,)

    @property
    def base_name(self) -> str:
        return "cls"

    def base_spec(self) -> str:
        return "cls"

    @classmethod
    def build(cls, name: str, num_layers: int, weighting: Weighting) -> ClsPooling | None:
        return cls(num_layers) if name in cls.names else None

    def pool(
        self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return states[self.num_layers][:, 0]


@dataclass(frozen=True)
class PoolerPooling(Pooling):
    """BERT's pooler head: a dense layer + tanh over the [CLS] state (the BERT-flow paper's "CLS").

    It reads the model's ``pooler_output``, so the model needs a pooler head (checked when the forward pass is
    planned) and runs to its last layer.
    """

    num_layers: int
    names = ("pooler",)

    @property
    def layers(self) -> tuple[int, ...]:
        return ()

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("pooler_output",)

    @property
    def base_name(self) -> str:
        return "pooler"

    def base_spec(self) -> str:
        return "pooler"

    @classmethod
    def build(cls, name: str, num_layers: int, weighting: Weighting) -> PoolerPooling | None:
        return cls(num_layers) if name in cls.names else None

    def pool(
        self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return states["pooler_output"]
