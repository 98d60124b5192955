"""Pooling: how a sentence vector is read out of a transformer's token states.

Pooling is always explicit and validated against the model; it is never guessed from the model's name.

Layer indices follow Hugging Face's ``hidden_states`` tuple: index 0 is the *embedding layer* output and
index ``i`` (1..L) is the output of transformer layer ``i``. The BERT-flow paper's "last2avg" is, in its code,
the average of the first and last *transformer* layers (``[1, L]``, our ``first-last-avg``); ports that wrote
``hidden_states[0]`` averaged the embedding layer instead, which costs about 4 STS points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import InputError

__all__ = ["POOLING_NAMES", "Pooling", "masked_mean"]

POOLING_NAMES = ("cls", "pooler", "mean", "first-last-avg", "last2avg")


@dataclass(frozen=True)
class Pooling:
    """A validated pooling strategy for a model with ``num_layers`` transformer layers.

    Args:
        name: ``"cls"`` (last-layer first-token state), ``"pooler"`` (BERT's tanh pooler over [CLS], the
            paper's CLS), ``"mean"`` (masked mean of the last layer), ``"first-last-avg"`` (masked mean of
            layers 1 and L; the paper's "last2avg"), ``"last2avg"`` (layers L-1 and L) or ``"layers"``.
        layers: the ``hidden_states`` indices whose masked means are averaged, non-negative and sorted
            (empty for ``cls`` and ``pooler``).
    """

    name: str
    layers: tuple[int, ...]

    @classmethod
    def parse(cls, spec: str | Sequence[int], num_layers: int) -> Pooling:
        """Build a pooling from a name, a comma-separated index list (``"1,-1"``) or a list of indices.

        Args:
            spec: pooling name or hidden-state indices (negative indices count from the last layer).
            num_layers: the model's number of transformer layers L (``hidden_states`` has L+1 entries).

        Raises:
            InputError: unknown name, empty list, or an index outside ``[-(L+1), L]``.
        """
        if isinstance(spec, str):
            text = spec.strip().lower().replace("_", "-")
            if text == "cls":
                return cls("cls", ())
            if text == "pooler":
                return cls("pooler", ())
            if text == "mean":
                return cls("mean", (num_layers,))
            if text in ("first-last-avg", "first-last"):
                return cls("first-last-avg", (1, num_layers))
            if text == "last2avg":
                return cls("last2avg", (num_layers - 1, num_layers))
            parts = [p.strip() for p in text.split(",") if p.strip()]
            try:
                indices = [int(p) for p in parts]
            except ValueError:
                raise InputError(
                    f"unknown pooling {spec!r}: use one of {', '.join(POOLING_NAMES)} "
                    "or a comma-separated list of hidden-state indices such as '1,-1'"
                ) from None
        else:
            indices = [int(i) for i in spec]
        if not indices:
            raise InputError("pooling layer list is empty: give at least one hidden-state index")
        resolved = []
        for i in indices:
            if not -(num_layers + 1) <= i <= num_layers:
                raise InputError(
                    f"pooling layer index {i} is out of range for a model with {num_layers} layers: "
                    f"valid hidden-state indices are 0 (embeddings) .. {num_layers} or -1 .. {-(num_layers + 1)}"
                )
            resolved.append(i % (num_layers + 1))
        return cls("layers", tuple(sorted(set(resolved))))

    @property
    def needs_hidden_states(self) -> bool:
        """Whether the model must return every layer (anything but the last layer or the pooler)."""
        return self.name in ("first-last-avg", "last2avg", "layers")

    @property
    def key(self) -> str:
        """Canonical text of the pooling for file names and dictionary keys: ``"mean"``, ``"layers-1-6"`` ..."""
        return self.name if self.name != "layers" else "layers-" + "-".join(str(i) for i in self.layers)

    def to_spec(self) -> str | list[int]:
        """The JSON form that :meth:`parse` turns back into this pooling."""
        return list(self.layers) if self.name == "layers" else self.name

    def __call__(self, outputs: object, attention_mask: torch.Tensor) -> torch.Tensor:
        """Pool a model output into sentence vectors.

        Args:
            outputs: a Hugging Face ``BaseModelOutput`` (with ``hidden_states`` when
                :attr:`needs_hidden_states`).
            attention_mask: [B, T] with 1 at real tokens, 0 at padding.

        Returns:
            [B, D] sentence vectors in the model's dtype.
        """
        if self.name == "cls":
            return outputs.last_hidden_state[:, 0]
        if self.name == "pooler":
            pooled = getattr(outputs, "pooler_output", None)
            if pooled is None:
                raise InputError("pooling 'pooler' needs a model with a pooler head; this model has none")
            return pooled
        if self.name == "mean":
            return masked_mean(outputs.last_hidden_state, attention_mask)
        hidden = outputs.hidden_states
        # Average the layers first, then take one masked mean: same result, one reduction.
        stacked = hidden[self.layers[0]]
        for i in self.layers[1:]:
            stacked = stacked + hidden[i]
        return masked_mean(stacked / len(self.layers), attention_mask)


def masked_mean(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens only.

    Args:
        states: [B, T, D] token states.
        attention_mask: [B, T], 1 for real tokens and 0 for padding.

    Returns:
        [B, D]; padding positions contribute nothing, whatever their values.
    """
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    summed = (states * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1)
