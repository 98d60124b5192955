"""Coupling layers (NICE additive and Glow affine) and the small network that conditions them.

Both couplings split a ``[B, n]`` input into ``x_a = x[:, :n - n//2]`` (passed through unchanged, and fed to
the network) and ``x_b = x[:, n - n//2:]`` (transformed), so odd ``n`` works and ``x_a`` is the larger half.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertflow.errors import InputError
from bertflow.flows.actnorm import ActNorm
from bertflow.flows.base import Transform

# Std of the normal init of the hidden Linear weights (Glow's default initializer). The ActNorm that follows
# each of them is data-initialised, so this only matters before `initialize` is called.
_HIDDEN_INIT_STD = 0.05


class ZeroLinear(nn.Module):
    """Zero-initialised linear output layer with a learned per-output log-scale (Glow's ``Conv2dZeros``).

    ``out = (h @ weight.T + bias) * exp(logscale_factor * logs)``; ``weight``, ``bias`` and ``logs`` all start
    at zero, so the coupling that uses it starts as (close to) the identity.
    """

    def __init__(self, in_features: int, out_features: int, logscale_factor: float = 3.0) -> None:
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.logscale_factor = float(logscale_factor)
        self.weight = nn.Parameter(torch.zeros(self.out_features, self.in_features))
        self.bias = nn.Parameter(torch.zeros(self.out_features))
        self.logs = nn.Parameter(torch.zeros(self.out_features))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"

    def forward(self, h: Tensor) -> Tensor:
        """Applies the layer."""
        return F.linear(h, self.weight, self.bias) * torch.exp(self.logscale_factor * self.logs)


class CouplingNet(nn.Module):
    """``Linear -> ActNorm -> ReLU -> Linear -> ActNorm -> ReLU -> ZeroLinear``, from ``n_in`` to ``n_out``.

    The hidden Linear layers have no bias: the ActNorm right after them has one (the official code's parameter
    count). ``hidden``: 32 in the official code; ``generator`` draws the hidden weights (default: the global RNG).
    """

    def __init__(
        self, in_features: int, out_features: int, hidden: int = 32, *, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_features, hidden, bias=False)
        self.norm1 = ActNorm(hidden)
        self.linear2 = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = ActNorm(hidden)
        self.out = ZeroLinear(hidden, out_features)
        with torch.no_grad():
            for lin in (self.linear1, self.linear2):
                w = torch.randn(lin.weight.shape, generator=generator, dtype=torch.float64)
                lin.weight.copy_(w * _HIDDEN_INIT_STD)

    def forward(self, x: Tensor) -> Tensor:
        """Computes the coupling parameters from the conditioning half."""
        h = F.relu(self.norm1(self.linear1(x))[0])
        h = F.relu(self.norm2(self.linear2(h))[0])
        return self.out(h)


class _Coupling(Transform):
    """Shared split logic: ``x_a = x[:, :n - n//2]`` conditions, ``x_b = x[:, n - n//2:]`` is transformed, by
    ``y_b = (x_b + shift) * exp(log_scale)`` with ``(shift, log_scale) = _shift_logscale(x_a)``; ``log_scale`` is
    ``None`` for a shift only (log-det 0). ``generator`` draws the network's hidden weights."""

    _net_out_per_feature = 1  # network outputs per transformed feature: the shift (and the affine's scale)

    def __init__(self, num_features: int, hidden: int = 32, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 2:
            raise InputError(f"{type(self).__name__} needs at least 2 features to split in two, got {num_features!r}")
        self.num_features = num_features
        self.n_a = num_features - num_features // 2
        self.n_b = num_features // 2
        self.hidden = int(hidden)
        self.net = CouplingNet(self.n_a, self._net_out_per_feature * self.n_b, hidden, generator=generator)

    def extra_repr(self) -> str:
        return f"{self.num_features}, hidden={self.hidden}"

    def _shift_logscale(self, x_a: Tensor) -> tuple[Tensor, Tensor | None]:
        return self.net(x_a), None

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Transforms the second half by functions of the first."""
        x_a, x_b = x[:, : self.n_a], x[:, self.n_a :]
        shift, log_scale = self._shift_logscale(x_a)
        y_b = x_b + shift
        if log_scale is None:
            return torch.cat([x_a, y_b], dim=1), x.new_zeros(x.shape[0])
        return torch.cat([x_a, y_b * torch.exp(log_scale)], dim=1), log_scale.sum(dim=1)

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Undoes :meth:`forward` (``y_a = x_a``, so the network sees the same input as in forward)."""
        y_a, y_b = y[:, : self.n_a], y[:, self.n_a :]
        shift, log_scale = self._shift_logscale(y_a)
        if log_scale is None:
            return torch.cat([y_a, y_b - shift], dim=1), y.new_zeros(y.shape[0])
        return torch.cat([y_a, y_b * torch.exp(-log_scale) - shift], dim=1), -log_scale.sum(dim=1)


class AdditiveCoupling(_Coupling):
    """NICE additive coupling ``y_b = x_b + net(x_a)``, ``y_a = x_a`` (the official BERT-flow default); volume
    preserving (log-det 0)."""


class AffineCoupling(_Coupling):
    """Glow affine coupling ``y_b = (x_b + shift) * sigmoid(raw + 2)``, ``y_a = x_a``.

    The network maps ``x_a`` to ``2 * n_b`` outputs, interleaved as in the official code: ``shift`` is
    ``out[:, 0::2]`` and ``raw`` is ``out[:, 1::2]``. The sigmoid keeps the scale in ``(0, 1)`` and the ``+2``
    makes it start near 0.88 rather than 0.5 with a zero-initialised network. The log-determinant is
    ``sum(log scale)`` over the ``n_b`` transformed features.
    """

    _net_out_per_feature = 2

    def _shift_logscale(self, x_a: Tensor) -> tuple[Tensor, Tensor]:
        out = self.net(x_a)
        # logsigmoid rather than log(sigmoid(.)): exact for very negative raw scales instead of -inf.
        return out[:, 0::2], F.logsigmoid(out[:, 1::2] + 2.0)
