"""Activation normalisation (Glow's ActNorm) with explicit, floored data-dependent initialisation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bertflow.errors import InputError
from bertflow.flows.base import Transform
from bertflow.validation import check_positive_int

# Absolute and relative floors on the per-feature std used by the data-dependent init. Real sentence-embedding
# checkpoints have (near-)constant dimensions; dividing by their raw std gives scales around 1e6 and the
# flow diverges on the first step.
_ABS_STD_FLOOR = 1e-6
_REL_STD_FLOOR = 1e-3


class ActNorm(Transform):
    """Per-feature affine normalisation ``y = (x + bias) * exp(logscale_factor * log_scale)``.

    Both parameters start at zero (the identity). Data-dependent initialisation is always explicit
    (:meth:`initialize`, :func:`initialize_actnorms`), never in ``forward``, so a loaded ``state_dict`` is never
    overwritten; the buffer ``initialized`` records it. ``logscale_factor`` (Glow: 3) raises the scale's effective
    learning rate over the bias's.
    """

    def __init__(self, num_features: int, logscale_factor: float = 3.0) -> None:
        super().__init__()
        self.num_features = check_positive_int("ActNorm num_features", num_features)
        self.logscale_factor = float(logscale_factor)
        self.bias = nn.Parameter(torch.zeros(self.num_features))
        self.log_scale = nn.Parameter(torch.zeros(self.num_features))
        self.register_buffer("initialized", torch.tensor(False))
        # Not state: `initialize_actnorms` sets it to a generator for the duration of one init pass, else None.
        self._data_init: torch.Generator | None = None

    def extra_repr(self) -> str:
        return f"{self.num_features}, logscale_factor={self.logscale_factor}"

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Sets ``bias`` and ``log_scale`` so that the output on ``x`` (``[N, C]``, ``N >= 2``, finite; else
        InputError) has zero mean and unit std per feature, in float64. The std is floored at
        ``max(1e-6, 1e-3 * median std)``, so a near-constant feature gets a large but bounded scale. Returns the
        bool mask ``[C]`` of the features whose std was floored."""
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise InputError(f"ActNorm.initialize expects a [N, {self.num_features}] batch, got shape {tuple(x.shape)}")
        if x.shape[0] < 2:
            raise InputError(f"ActNorm.initialize needs at least 2 samples to estimate a std, got {x.shape[0]}")
        xd = x.detach().to(torch.float64)
        if not torch.isfinite(xd).all():
            raise InputError("ActNorm.initialize got non-finite values (NaN or inf) in its batch")
        mean = xd.mean(dim=0)
        std = xd.std(dim=0, correction=0)
        floor = torch.clamp(_REL_STD_FLOOR * std.median(), min=_ABS_STD_FLOOR)
        std_used = torch.maximum(std, floor)
        self.bias.copy_((-mean).to(self.bias.dtype))
        self.log_scale.copy_((-torch.log(std_used) / self.logscale_factor).to(self.log_scale.dtype))
        self.initialized.fill_(True)
        return std < floor

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Normalises ``x``."""
        floored = self.initialize(x) if self._data_init is not None else None
        logs = self.logscale_factor * self.log_scale
        y = (x + self.bias) * torch.exp(logs)
        ladj = logs.sum().expand(x.shape[0])
        if floored is not None and bool(floored.any()):
            # Init pass only: hand the floored features on as unit-variance stand-ins (see initialize_actnorms).
            noise = torch.randn(x.shape[0], int(floored.sum()), generator=self._data_init, dtype=torch.float64)
            y = y.clone()
            y[:, floored.to(y.device)] = noise.to(device=y.device, dtype=y.dtype)
        return y, ladj

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Undoes the normalisation."""
        logs = self.logscale_factor * self.log_scale
        x = y * torch.exp(-logs) - self.bias
        return x, (-logs.sum()).expand(y.shape[0])


def initialize_actnorms(transform: Transform, x: Tensor) -> None:
    """Data-dependent initialisation of every :class:`ActNorm` in ``transform`` with one forward pass on ``x``
    [N >= 2, D] (InputError if unusable, see :meth:`ActNorm.initialize`).

    During the pass each ActNorm initialises itself on its own input before transforming it, so they are
    initialised in the order data flows through them (later ones see the normalised outputs of earlier ones, as in
    Glow). The mode is switched off on exit, even on error.

    One deliberate difference from a plain forward pass: a feature an ActNorm had to floor is passed on as seeded
    standard-normal noise. Otherwise every ActNorm downstream floors it again, multiplying gains of up to ~1e3
    until the total is the naive ``1 / std`` the floor prevents (~1e9), and the first training step diverges. The
    pass's outputs are therefore not meaningful; only the initialised parameters are.
    """
    norms = [m for m in transform.modules() if isinstance(m, ActNorm)]
    gen = torch.Generator().manual_seed(0)  # the stand-in noise: fixed, so that initialisation is deterministic
    for m in norms:
        m._data_init = gen
    try:
        with torch.no_grad():
            transform(x)
    finally:
        for m in norms:
            m._data_init = None
