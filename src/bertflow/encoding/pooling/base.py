"""The pooling contract and its registry: what a pooling needs from the forward pass, and how specs are parsed.

A pooling declares the hidden-state indices it reads (:attr:`Pooling.layers`; Hugging Face's ``hidden_states``:
0 is the embedding layer, ``i`` in 1..L the output of transformer layer ``i``) and any other model output
(:attr:`Pooling.inputs`); the forward pass (:class:`bertflow.encoding.forward.ModelRunner`) collects every needed
layer once and hands them to each pooling's :meth:`Pooling.pool`.

A spec is ``[weighting:]name``: a registered name (``cls``, ``mean``, ``first-last-avg`` ...) or hidden-state
indices (``"1,-1"`` or a list of ints), optionally with a token weighting (``sif:mean``, :mod:`.weighting`) for
poolings that average tokens, parsed once against the model's depth by :meth:`Pooling.parse`. Adding a pooling is
one class in a new module of this package (docs/architecture.md, "Recipe: a new pooling").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from ...errors import InputError
from .weighting import NO_WEIGHTING, Weighting

#: Every pooling class, in definition order (filled by ``Pooling.__init_subclass__``).
_REGISTRY: list[type[Pooling]] = []


class Pooling(ABC):
    """A validated way of reading sentence vectors out of a transformer's token states.

    Subclasses are immutable values (frozen dataclasses): equal specs give equal poolings. Class attributes:
    ``names``, the spec names it parses (the first canonical); ``averages_tokens``, whether a token weighting
    applies; ``portable``, whether sentence-transformers' own modules compute it (the export then needs no bertflow).
    """

    names: ClassVar[tuple[str, ...]] = ()
    averages_tokens: ClassVar[bool] = False
    portable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.names:
            _REGISTRY.append(cls)

    @property
    @abstractmethod
    def layers(self) -> tuple[int, ...]:
        """The ``hidden_states`` indices :meth:`pool` reads, non-negative and sorted."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """Other model outputs :meth:`pool` reads by name (``"pooler_output"``: [B, D]); none by default."""
        return ()

    @property
    def weighting(self) -> Weighting:
        """The token weighting (``none`` unless the subclass takes one)."""
        return NO_WEIGHTING

    @property
    @abstractmethod
    def base_name(self) -> str:
        """The unweighted pooling's name (``"mean"``, ``"first-last-avg"``, ``"layers"`` ...)."""

    @abstractmethod
    def base_spec(self) -> str | list[int]:
        """The unweighted pooling's JSON spec (a name, or for an index list the list)."""

    @abstractmethod
    def pool(
        self, states: Mapping[int | str, torch.Tensor], mask: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sentence vectors [B, D] in the dtype of ``states``: ``{index: [B, T, D]}`` for every index of
        :attr:`layers` and ``{name: tensor}`` for every name of :attr:`inputs` (others are ignored); ``mask`` [B, T]
        true at real tokens; ``weights`` [B, T] per-token weights for a weighted pooling, else ``None``."""

    @classmethod
    @abstractmethod
    def build(cls, name: str, num_layers: int, weighting: Weighting) -> Pooling | None:
        """This class's pooling for the (normalised) spec ``name`` on a model with ``num_layers`` layers, ``None``
        when ``name`` is not one of its specs, an InputError when it is but does not fit the model."""

    @property
    def name(self) -> str:
        """Readable spec: ``"mean"``, ``"layers"``, ``"sif:first-last-avg"`` ..."""
        w = self.weighting
        return self.base_name if not w.weighted else f"{w.spec}:{self.base_name}"

    @property
    def key(self) -> str:
        """Canonical text for file names and dictionary keys: ``"mean"``, ``"layers-1-6"``, ``"sif-mean"`` ..."""
        spec = self.base_spec()
        base = spec if isinstance(spec, str) else "layers-" + "-".join(str(i) for i in spec)
        w = self.weighting
        return base if not w.weighted else f"{w.spec}-{base}"

    def to_spec(self) -> str | list[int]:
        """The JSON form that :meth:`parse` turns back into this pooling."""
        spec = self.base_spec()
        if not self.weighting.weighted:
            return spec
        text = spec if isinstance(spec, str) else ",".join(str(i) for i in spec)
        return f"{self.weighting.spec}:{text}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, spec: str | Sequence[int] | Pooling, num_layers: int) -> Pooling:
        """Build a pooling from a spec (``"mean"``, ``"sif:first-last-avg"``, ``"1,-1"``, ``[0, -1]``, or a
        :class:`Pooling`, returned as is), checked against the model's ``num_layers`` transformer layers; an
        InputError for an unknown name or weighting, a bad index list, or a weighting on a non-averaging pooling."""
        if isinstance(spec, Pooling):
            return spec
        if isinstance(spec, str):
            text = spec.strip().lower().replace("_", "-")
        else:  # an empty list is refused by the layer pooling's build, as an empty string
            text = ",".join(str(int(i)) for i in spec)
        weighting = NO_WEIGHTING
        if ":" in text:
            prefix, _, text = text.partition(":")
            weighting = Weighting.parse(prefix)
        for kind in _REGISTRY:
            pooling = kind.build(text.strip(), num_layers, weighting)
            if pooling is None:
                continue
            if weighting.weighted and not kind.averages_tokens:
                raise InputError(
                    f"weighting {weighting.spec!r} applies to poolings that average tokens "
                    f"({', '.join(pooling_names(averaging=True))} or layer lists), not {pooling.base_name!r}"
                )
            return pooling
        raise InputError(
            f"unknown pooling {spec!r}: use one of {', '.join(pooling_names())}, a comma-separated list of "
            "hidden-state indices such as '1,-1', optionally with a weighting prefix such as 'sif:mean'"
        )


def parse_without_model(spec: str | Sequence[int] | Pooling) -> Pooling:
    """``spec`` parsed with no model at hand, for what does not depend on one (its class, its weighting): layer
    indices are checked against a model only by :meth:`Pooling.parse` with its real depth."""
    return Pooling.parse(spec, num_layers=10**6)


def registered_poolings() -> tuple[type[Pooling], ...]:
    """Every pooling class, in registration order."""
    return tuple(_REGISTRY)


def pooling_names(*, averaging: bool = False) -> list[str]:
    """The canonical name of every registered pooling (only those that average tokens with ``averaging``)."""
    return [kind.names[0] for kind in _REGISTRY if kind.averages_tokens or not averaging]


def masked_mean(states: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """[B, D] mean of ``states`` [B, T, D] over real tokens (``mask`` [B, T] 1 there), with optional positive
    ``weights`` [B, T] ``sum_t w_t m_t h_t / sum_t w_t m_t``; padding contributes nothing, whatever its values."""
    m = mask.unsqueeze(-1).to(states.dtype)
    if weights is None:
        summed = (states * m).sum(dim=1)
        return summed / m.sum(dim=1).clamp(min=1)
    m = m * weights.unsqueeze(-1).to(states.dtype)
    # Every sentence has a real token and weights are positive, so the sum is positive; the floor only keeps an
    # all-padding row (which never reaches here from the encoder) finite.
    return (states * m).sum(dim=1) / m.sum(dim=1).clamp(min=torch.finfo(states.dtype).tiny)
