"""Multi-scale Glow on ``D``-dimensional vectors, as used by BERT-flow.

A sentence embedding is treated as a 1x1 image with ``D`` channels, so there is no squeeze and every layer
acts on ``[B, C]`` rows. Level ``i`` runs ``depth`` :class:`FlowStep`s on its ``C_i`` channels; after every
level but the last, the first ``C_i - C_i // 2`` channels go on to the next level and the other ``C_i // 2``
are factored out and scored under a fixed standard normal. The latent is
``z = [factored-out part of level 0, of level 1, ..., output of the last level]``, of dimension ``D``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Collection
from typing import Any, Literal

import torch
from torch import Tensor

from bertflow.errors import InputError
from bertflow.flows.actnorm import ActNorm, initialize_actnorms
from bertflow.flows.base import Composite, Transform
from bertflow.flows.coupling import AdditiveCoupling, AffineCoupling
from bertflow.flows.permutation import InvertibleLinearLU, RandomPermutation, ReversePermutation
from bertflow.validation import check_positive_int

CouplingName = Literal["additive", "affine"]
PermutationName = Literal["reverse", "random", "lu"]

COUPLINGS = {"additive": AdditiveCoupling, "affine": AffineCoupling}
PERMUTATIONS = {"reverse": lambda n, seed: ReversePermutation(n), "random": RandomPermutation, "lu": InvertibleLinearLU}

GLOW_PRESETS: dict[str, dict[str, Any]] = {
    # The official BERT-flow code's defaults (151,488 trainable parameters at D = 768).
    "code": dict(n_levels=3, depth=3, coupling="additive", permutation="reverse"),
    # The configuration described in the BERT-flow paper.
    "paper": dict(n_levels=2, depth=3, coupling="additive", permutation="random"),
}

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _check_name(kind: str, name: str, allowed: Collection[str]) -> None:
    if name not in allowed:
        raise InputError(f"unknown {kind} {name!r}; expected one of {', '.join(repr(a) for a in allowed)}")


class FlowStep(Transform):
    """One Glow step on ``[B, C]`` (``C >= 2``): ``ActNorm -> permutation -> coupling`` (data -> latent).

    ``coupling``: ``"additive"`` (NICE) or ``"affine"`` (Glow); ``permutation``: ``"reverse"``, ``"random"`` (fixed)
    or ``"lu"`` (learned 1x1 conv); ``seed`` seeds the permutation / LU and the coupling network's init.
    """

    def __init__(
        self,
        num_features: int,
        hidden_channels: int = 32,
        coupling: CouplingName = "additive",
        permutation: PermutationName = "reverse",
        seed: int = 0,
    ) -> None:
        super().__init__()
        _check_name("coupling", coupling, COUPLINGS)
        _check_name("permutation", permutation, PERMUTATIONS)
        self.actnorm = ActNorm(num_features)
        self.permutation: Transform = PERMUTATIONS[permutation](num_features, seed)
        # Offset so the net's init stream is not the one that drew the permutation.
        gen = torch.Generator().manual_seed(int(seed) + 1)
        self.coupling = COUPLINGS[coupling](num_features, hidden_channels, generator=gen)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Applies ActNorm, permutation and coupling."""
        x, ld1 = self.actnorm(x)
        x, ld2 = self.permutation(x)
        x, ld3 = self.coupling(x)
        return x, ld1 + ld2 + ld3

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Undoes coupling, permutation and ActNorm."""
        y, ld3 = self.coupling.inverse(y)  # type: ignore[operator]
        y, ld2 = self.permutation.inverse(y)  # type: ignore[operator]
        y, ld1 = self.actnorm.inverse(y)
        return y, ld1 + ld2 + ld3


class Glow(Transform):
    """Multi-scale Glow mapping ``D``-dimensional embeddings to a standard normal latent (data -> latent).

    ``n_levels`` levels (each keeping at least 2 channels) of ``depth`` :class:`FlowStep`; ``hidden_channels``,
    ``coupling``, ``permutation`` as there. ``seed`` seeds every initialisation through private generators, so
    ``Glow(**glow.get_config())`` rebuilds an identical untrained model; all that state is also in parameters or
    buffers, so ``load_state_dict`` restores it. Bad names or sizes are InputError.
    """

    def __init__(
        self,
        n_features: int,
        n_levels: int = 3,
        depth: int = 3,
        hidden_channels: int = 32,
        coupling: CouplingName = "additive",
        permutation: PermutationName = "reverse",
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name in ("n_features", "n_levels", "depth", "hidden_channels"):
            check_positive_int(name, locals()[name])
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InputError(f"seed must be an integer, got {seed!r}")

        channels = [n_features]
        for _ in range(n_levels - 1):
            channels.append(channels[-1] - channels[-1] // 2)
        max_levels = sum(c >= 2 for c in channels)  # channels only shrink: level max_levels is the first too small
        if max_levels < n_levels:
            raise InputError(
                f"Glow with n_levels={n_levels} leaves {channels[max_levels]} channel(s) at level {max_levels} for "
                f"n_features={n_features}, but every level needs at least 2 channels to split for its "
                f"couplings; use n_levels <= {max_levels} or more features"
            )

        self.n_features = n_features
        self.n_levels = n_levels
        self.depth = depth
        self.hidden_channels = hidden_channels
        self.coupling = coupling
        self.permutation = permutation
        self.seed = seed
        self.level_channels: tuple[int, ...] = tuple(channels)
        # Sizes of the latent blocks in z order: factored-out parts of levels 0..L-2, then the last output.
        self.latent_sizes: tuple[int, ...] = tuple(c // 2 for c in channels[:-1]) + (channels[-1],)

        # One private stream hands every step its own seed: reproducible from `seed`, global RNG untouched.
        gen = torch.Generator().manual_seed(seed)
        levels = []
        for c in channels:
            steps = []
            for _ in range(depth):
                step_seed = int(torch.randint(0, 2**62, (), generator=gen))
                steps.append(FlowStep(c, hidden_channels, coupling, permutation, step_seed))
            levels.append(Composite(*steps))
        self.levels = torch.nn.ModuleList(levels)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())

    @classmethod
    def from_preset(cls, name: str, n_features: int, **overrides: Any) -> Glow:
        """Builds a Glow from a named preset of :data:`GLOW_PRESETS`."""
        _check_name("Glow preset", name, GLOW_PRESETS)
        return cls(n_features, **{**GLOW_PRESETS[name], **overrides})

    def get_config(self) -> dict[str, Any]:
        """Returns the constructor arguments as a JSON-serialisable dict (``Glow(**cfg)`` rebuilds it)."""
        return {name: getattr(self, name) for name in inspect.signature(Glow).parameters}

    def _check_input(self, x: Tensor, what: str) -> None:
        if x.dim() != 2 or x.shape[1] != self.n_features:
            raise InputError(f"Glow.{what} expects a [B, {self.n_features}] tensor, got shape {tuple(x.shape)}")

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Maps embeddings to the latent (ordered as described in the module docstring)."""
        self._check_input(x, "forward")
        ladj = x.new_zeros(x.shape[0])
        parts = []
        for i, level in enumerate(self.levels):
            x, ld = level(x)
            ladj = ladj + ld
            if i < self.n_levels - 1:
                keep = self.level_channels[i + 1]
                parts.append(x[:, keep:])
                x = x[:, :keep]
        parts.append(x)
        return torch.cat(parts, dim=1), ladj

    def inverse(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Maps latent values back to embedding space."""
        self._check_input(z, "inverse")
        blocks = torch.split(z, list(self.latent_sizes), dim=1)
        ladj = z.new_zeros(z.shape[0])
        h = blocks[-1]
        for i in reversed(range(self.n_levels)):
            if i < self.n_levels - 1:
                h = torch.cat([h, blocks[i]], dim=1)
            h, ld = self.levels[i].inverse(h)  # type: ignore[operator]
            ladj = ladj + ld
        return h, ladj

    def log_prob(self, x: Tensor) -> Tensor:
        """Log-density ``[B]`` of ``x`` under the flow, in nats: ``sum_d log N(z_d; 0, 1) + log|det dz/dx|``."""
        z, ladj = self.forward(x)
        log_pz = -0.5 * z.square().sum(dim=1) - self.n_features * _HALF_LOG_2PI
        return log_pz + ladj

    def bits_per_dim(self, x: Tensor) -> Tensor:
        """Negative log-density per dimension in bits: ``-log_prob(x) / (D * ln 2)`` (the official objective); a
        differential entropy, so typically negative once fitted."""
        return -self.log_prob(x) / (self.n_features * math.log(2.0))

    def initialize(self, x: Tensor) -> None:
        """Explicit data-dependent initialisation of every ActNorm (``x``: ``[N, D]``, ``N >= 2``), in the order
        data flows through them, in one no-grad pass; never implicit. A floored feature goes on as unit-variance
        stand-in noise so later ActNorms do not floor it again (:func:`bertflow.flows.actnorm.initialize_actnorms`)."""
        self._check_input(x, "initialize")
        initialize_actnorms(self, x)

    @property
    def is_initialized(self) -> bool:
        """Whether every ActNorm in the model has been data-initialised (or loaded as such)."""
        return all(bool(m.initialized) for m in self.modules() if isinstance(m, ActNorm))
