"""Base class of every invertible transform in the flow, and their composition.

Sign convention (used by every transform in :mod:`bertflow.flows`):

* The forward direction is ALWAYS data -> latent. ``forward(x)`` returns ``(y, ladj)`` where ``ladj`` is
  ``log|det dy/dx|`` for each sample, in nats.
* ``inverse(y)`` returns ``(x, ladj_inv)`` where ``ladj_inv = log|det dx/dy| = -ladj`` evaluated at the same
  pair ``(x, y)``.

With this convention the change of variables reads ``log p_x(x) = log p_z(forward(x)[0]) + forward(x)[1]``.
"""

from __future__ import annotations

from torch import Tensor, nn


class Transform(nn.Module):
    """An invertible map on ``[B, D]`` batches with its log-determinant (the module's sign convention; ``[B]``, in
    nats). Transforms keep the number of features and never mix the samples of a batch."""

    def extra_repr(self) -> str:
        return str(getattr(self, "num_features", ""))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Maps data to latent: ``(y, log|det dy/dx|)``."""
        raise NotImplementedError

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Maps latent back to data: ``(x, log|det dx/dy|)``, minus the forward log-determinant."""
        raise NotImplementedError


class Composite(Transform):
    """Chains transforms (data -> latent order, submodules ``transforms.0``, ``transforms.1`` ...): ``forward``
    applies them in order, ``inverse`` in reverse, summing the log-determinants."""

    def __init__(self, *transforms: Transform) -> None:
        super().__init__()
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"Composite takes Transform instances, got {type(t).__name__}")
        self.transforms = nn.ModuleList(transforms)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Applies every transform in order."""
        ladj = x.new_zeros(x.shape[0])
        for t in self.transforms:
            x, ld = t(x)
            ladj = ladj + ld
        return x, ladj

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Undoes every transform, last one first."""
        ladj = y.new_zeros(y.shape[0])
        for t in reversed(self.transforms):
            y, ld = t.inverse(y)  # type: ignore[operator]
            ladj = ladj + ld
        return y, ladj
