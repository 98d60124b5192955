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
class _OneName(Pooling):
    """A pooling with one spec name and no parameter but the model's depth (unregistered: no ``names``)."""

    num_layers: int

    @property
    def base_name(self) -> str:
        return self.names[0]

    def base_spec(self) -> str:
        return self.names[0]

    @classmethod
    def build(cls, name: str, num_layers: int, weighting: Weighting) -> _OneName | None:
        return cls(num_layers) if name in cls.names else None


@dataclass(frozen=True)
class ClsPooling(_OneName):
    """The last layer's state of the first token ([CLS] for BERT), as sentence-transformers' ``cls`` mode."""

    names = ("cls",)
    portable = True  # sentence-transformers' Pooling "cls"

    @property
    def layers(self) -> tuple[int, ...]:
        return (self.num_layers,)

    def pool(
        self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return states[self.num_layers][:, 0]


@dataclass(frozen=True)
class PoolerPooling(_OneName):
    """BERT's pooler head: a dense layer + tanh over the [CLS] state (the BERT-flow paper's "CLS"), read from the
    model's ``pooler_output`` (the model needs a pooler head, checked when the forward pass is planned)."""

    names = ("pooler",)

    @property
    def layers(self) -> tuple[int, ...]:
        return ()

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("pooler_output",)

    def pool(
        self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return states["pooler_output"]
