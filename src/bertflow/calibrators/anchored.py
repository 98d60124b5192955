"""Anchored whitening: partial whitening mixed with the raw cosine, the mix set by the data's anisotropy.

Full whitening and the flow hurt encoders trained for cosine similarity and help only anisotropic embeddings,
whose raw cosines all crowd near a common value; so this calibrator keeps the raw cosine as an *anchor* and adds
a calibrated cosine in proportion to the anisotropy of the fitting sentences, measured without labels
(``docs/beyond.md`` has the measurements behind the defaults).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..linalg import unit_rows
from ..typing import TorchTransform
from .base import Calibrator, as_tensor
from .registry import register
from .whitening import fit_spectrum, mean_and_covariance, read_projection

logger = logging.getLogger(__name__)


def anisotropy(X: np.ndarray) -> float:
    r"""Expected cosine similarity of two sentences drawn independently from ``X`` [N, D].

    Computed exactly as :math:`\lVert \frac1N \sum_i x_i / \lVert x_i \rVert \rVert^2` (the mean cosine over
    all N^2 ordered pairs, self-pairs included): 0 for embeddings spread evenly around the origin, 1 when every
    embedding points the same way.
    """
    arr = np.asarray(X, dtype=np.float64)
    m = unit_rows(arr).mean(axis=0)
    return float(np.clip(m @ m, 0.0, 1.0))


@register("anchored")
class AnchoredWhiteningCalibrator(Calibrator):
    r"""Raw cosine anchored mix with partially whitened cosine, weighted by the data's anisotropy.

    The output of a sentence embedding :math:`x` is the concatenation

    .. math:: \big[\sqrt{1-\beta}\;\hat x,\;\sqrt{\beta}\;\hat z\big],\qquad
              z = (x - \mu)\,U\,\Lambda^{-\alpha/2},

    where :math:`\hat{\cdot}` scales to unit length and :math:`U \Lambda U^T` is the covariance of the fitting
    embeddings. Both blocks have unit length, so the cosine of two outputs is exactly
    :math:`(1-\beta)\cos(x, y) + \beta \cos(z_x, z_y)`: a convex mix of the raw cosine and the cosine after
    partial whitening (:math:`\alpha = 0`: centring only; :math:`\alpha = 1`: BERT-whitening).

    Args:
        alpha: whitening strength :math:`\alpha \in [0, 1]`; 0.5 (:math:`\Sigma^{-1/4}`, the default) is also what
            STS-B dev labels prefer (``docs/beyond.md``).
        weight: :math:`\beta \in [0, 1]`; ``None`` (default, the rule): the :func:`anisotropy` of the fitting
            embeddings.
        rcond: as in :class:`WhiteningCalibrator`.

    Attributes:
        mean_, components_ ([D, k], :math:`U_k \Lambda_k^{-\alpha/2}`), explained_variance_, shrinkage_: as in
            :class:`WhiteningCalibrator`; the output has ``D + k`` columns.
        anisotropy_: anisotropy of the fitting embeddings; weight_: :math:`\beta` actually used.
    """

    rescales_variance = True
    specs = {
        "anchored": "anchored whitening: raw cosine mixed with Sigma^-1/4-whitened cosine, weight = anisotropy",
        "anchored-P": "anchored whitening with whitening strength alpha = P/100 (anchored-100: full whitening)",
    }

    @classmethod
    def from_spec(cls, spec: str, number: int | None, **options: Any) -> AnchoredWhiteningCalibrator:
        """``anchored`` or ``anchored-P``: whitening strength ``alpha = P / 100``."""
        if number is None:
            return cls()
        if number > 100:
            raise InputError(f"anchored-P takes a whitening strength P between 0 and 100 (percent), got {number}")
        return cls(number / 100)

    def __init__(self, alpha: float = 0.5, *, weight: float | None = None, rcond: float = 1e-6) -> None:
        self.alpha = alpha
        self.weight = weight
        self.rcond = rcond

    def _validate_params(self, X: np.ndarray) -> None:
        if not 0.0 <= float(self.alpha) <= 1.0:
            raise InputError(f"alpha must be in [0, 1] (0: centring, 1: whitening), got {self.alpha}")
        if self.weight is not None and not 0.0 <= float(self.weight) <= 1.0:
            raise InputError(f"weight must be in [0, 1] or None (set from the data's anisotropy), got {self.weight}")
        if not 0 <= self.rcond < 1:
            raise InputError(f"rcond must be in [0, 1), got {self.rcond}")

    def _fit(self, X: np.ndarray) -> None:
        self._fit_mix(X, float(self.alpha), self.weight)

    def _fit_mix(self, X: np.ndarray, alpha: float, weight: float | None) -> None:
        """Fit the partial whitening of strength ``alpha`` and the mix ``weight`` (None: the anisotropy)."""
        self.mean_, cov = mean_and_covariance(X)
        # N <= D rows: the partial whitening too would be estimated from a singular covariance (whitening.py).
        eigvals, eigvecs, self.shrinkage_ = fit_spectrum(cov, self.mean_, len(X), None, self.rcond, "anchored")
        self.explained_variance_ = eigvals
        self.components_ = eigvecs * self.explained_variance_ ** (-alpha / 2.0)
        self.anisotropy_ = anisotropy(X)
        self.weight_ = self.anisotropy_ if weight is None else float(weight)
        logger.info(
            "anchored: anisotropy %.3f, weight of the calibrated cosine %.3f, alpha %.2f, %d of %d directions",
            self.anisotropy_,
            self.weight_,
            alpha,
            len(eigvals),
            X.shape[1],
        )

    def _transform(self, X: np.ndarray) -> np.ndarray:
        raw = unit_rows(X)
        cal = unit_rows((X - self.mean_) @ self.components_)
        return np.hstack([np.sqrt(1.0 - self.weight_) * raw, np.sqrt(self.weight_) * cal])

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        mean, components = as_tensor(self.mean_, device), as_tensor(self.components_, device)
        raw_weight, cal_weight = float(np.sqrt(1.0 - self.weight_)), float(np.sqrt(self.weight_))

        def unit_rows(x: torch.Tensor) -> torch.Tensor:
            norm = x.norm(dim=1, keepdim=True)
            return torch.where(norm > 0, x / norm.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))

        def mix(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([raw_weight * unit_rows(x), cal_weight * unit_rows((x - mean) @ components)], dim=1)

        return mix

    @property
    def n_features_out_(self) -> int:
        self.check_fitted()
        return self.n_features_in_ + self.components_.shape[1]

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {
            "n_components": int(self.components_.shape[1]),
            "shrinkage": float(self.shrinkage_),
            "anisotropy": float(self.anisotropy_),
            "weight": float(self.weight_),
        }
        arrays = {"mean": self.mean_, "components": self.components_, "explained_variance": self.explained_variance_}
        return meta, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        k = int(meta["n_components"])
        self.mean_, self.components_, self.explained_variance_ = read_projection(arrays, self.n_features_in_, k)
        self.anisotropy_ = float(meta["anisotropy"])
        self.weight_ = float(meta["weight"])
        self.shrinkage_ = float(meta.get("shrinkage", 0.0))  # absent from folders saved before it existed
        if not 0.0 <= self.weight_ <= 1.0:
            raise ValueError(f"weight {self.weight_} is outside [0, 1]")
