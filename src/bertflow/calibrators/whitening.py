"""BERT-whitening (Su et al. 2021): centre, then rotate and rescale to identity covariance, optionally keeping k."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import InputError
from .base import Calibrator, expect_shape, register

__all__ = ["WhiteningCalibrator"]

logger = logging.getLogger(__name__)


@register("whitening")
class WhiteningCalibrator(Calibrator):
    r"""Whitening: :math:`\tilde x = (x - \mu) U_k \Lambda_k^{-1/2}` from the eigendecomposition of the covariance.

    Args:
        n_components: keep the top k principal directions ("whitening-k", e.g. 256 for BERT-base); ``None``
            keeps every direction that carries variance.
        shrinkage: :math:`\lambda \ge 0`; whitens with :math:`(\Sigma + \lambda\,\bar s I)^{-1/2}` where
            :math:`\bar s` is the mean eigenvalue, interpolating between whitening (0) and mere centring and
            rotation (large). Also the remedy when there are fewer sentences than dimensions.
        rcond: directions whose eigenvalue is below ``rcond`` times the largest are dropped, not amplified.
            Real checkpoints have (near-)constant output dimensions (all-MiniLM-L6-v2 at 127, 223, 319);
            scaling their rounding noise up to unit variance would add pure-noise coordinates to the cosine.

    Attributes:
        mean_: [D] mean of the fitting embeddings.
        components_: [D, k] the whitening matrix W, so ``transform(X) = (X - mean_) @ components_``.
        explained_variance_: [k] eigenvalues (after shrinkage) of the kept directions, descending.
        n_components_: k actually kept.
        n_features_in_: D.

    References:
        Su et al., "Whitening Sentence Representations for Better Semantics and Faster Retrieval", 2021,
        arXiv:2103.15316.
    """

    def __init__(self, n_components: int | None = None, *, shrinkage: float = 0.0, rcond: float = 1e-6) -> None:
        self.n_components = n_components
        self.shrinkage = shrinkage
        self.rcond = rcond

    def _validate_params(self, X: np.ndarray) -> None:
        d = X.shape[1]
        if self.n_components is not None and not (1 <= int(self.n_components) <= d):
            raise InputError(
                f"n_components must be between 1 and {d} (the embedding dimension), got {self.n_components}"
            )
        if self.shrinkage < 0 or not 0 <= self.rcond < 1:
            raise InputError("shrinkage must be >= 0 and rcond in [0, 1)")

    def _fit(self, X: np.ndarray) -> None:
        n, d = X.shape
        self.mean_ = X.mean(axis=0)
        centred = X - self.mean_
        cov = centred.T @ centred / (n - 1)
        eigvals, eigvecs = np.linalg.eigh(cov)  # ascending; symmetric, so eigh is exact and cheaper than SVD
        eigvals, eigvecs = eigvals[::-1].clip(min=0.0), eigvecs[:, ::-1]
        if self.shrinkage > 0:
            eigvals = eigvals + self.shrinkage * eigvals.mean()
        keep = eigvals > self.rcond * eigvals[0]
        rank = int(keep.sum())
        if rank < d:
            logger.warning(
                "whitening: %d of %d directions carry (almost) no variance%s and are dropped",
                d - rank,
                d,
                f" (only {n} samples)" if n <= d else "",
            )
        k = rank if self.n_components is None else min(int(self.n_components), rank)
        self.explained_variance_ = eigvals[:k]
        self.components_ = eigvecs[:, :k] / np.sqrt(eigvals[:k])
        self.n_components_ = k

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean_) @ self.components_

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Map whitened vectors back; exact when every direction was kept, a projection otherwise."""
        self._check_fitted()
        Z = np.asarray(Z, dtype=np.float64)
        # W = U / sqrt(s), so the inverse map U sqrt(s) is W * s.
        return (Z @ (self.components_ * self.explained_variance_).T + self.mean_).astype(np.float32)

    @property
    def n_features_out_(self) -> int:
        self._check_fitted()
        return self.n_components_

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays = {"mean": self.mean_, "components": self.components_, "explained_variance": self.explained_variance_}
        return {"n_components": self.n_components_}, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        k = int(meta["n_components"])
        d = self.n_features_in_
        self.mean_ = expect_shape(arrays, "mean", (d,)).astype(np.float64)
        self.components_ = expect_shape(arrays, "components", (d, k)).astype(np.float64)
        self.explained_variance_ = expect_shape(arrays, "explained_variance", (k,)).astype(np.float64)
        self.n_components_ = k
