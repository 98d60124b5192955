"""BERT-whitening (Su et al. 2021): centre, then rotate and rescale to identity covariance, optionally keeping k."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..typing import TorchTransform
from .base import SPREAD_RTOL, Calibrator, as_tensor, check_latents, expect_shape, no_variance_message
from .registry import register

logger = logging.getLogger(__name__)


def mean_and_covariance(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean [D] and sample covariance [D, D] (divided by N - 1) of the rows of ``X`` [N, D], N >= 2."""
    mean = X.mean(axis=0)
    centred = X - mean
    return mean, centred.T @ centred / (X.shape[0] - 1)


#: Largest weight of the identity target that automatic shrinkage uses (a shrinkage of 99 mean eigenvalues):
#: Oracle Approximating Shrinkage reaches 1 only for covariances that are already nearly isotropic, where any large
#: value gives the same cosines, and a finite value keeps ``shrinkage_`` a plain JSON number.
MAX_AUTO_SHRINKAGE = 0.99


def oas_shrinkage(eigvals: np.ndarray, n: int) -> float:
    r"""Oracle Approximating Shrinkage (Chen et al. 2010): the weight :math:`\rho \in [0, 1]` of the target
    :math:`\mu I` (:math:`\mu` the mean eigenvalue) in :math:`(1-\rho) S + \rho \mu I` that minimises the expected
    squared error for Gaussian data, from the eigenvalues [D] of the sample covariance :math:`S` of ``n`` rows.

    It needs only the eigenvalues and ``n``, so a fit from moments (distributed) gets the same value as a fit
    from rows. The formula is scikit-learn's ``sklearn.covariance.oas``.
    """
    p = len(eigvals)
    mu = float(eigvals.mean())
    alpha = float((eigvals**2).sum()) / p**2  # mean of the squared entries of S
    num = alpha + mu**2
    den = (n + 1) * (alpha - mu**2 / p)
    return 1.0 if den <= 0 else min(num / den, 1.0)


def singular_shrinkage(shrinkage: float | None, eigvals: np.ndarray, n: int, what: str) -> float:
    r"""The shrinkage :math:`\lambda` (covariance eigenvalues become :math:`\lambda_i + \lambda \bar s`) to whiten with.

    ``shrinkage`` given: that value. ``None``: 0 when there are more rows than dimensions, else automatic. With
    ``n <= D`` rows the covariance is singular (rank at most ``n - 1``), and whitening its ``n - 1`` directions
    maps the ``n`` fitting rows onto the vertices of a regular simplex: every pair of fitting sentences gets the
    same cosine, -1/(n-1), whatever they say, and held-out sentences are scaled along directions estimated from
    almost nothing (whitening the 200 sentences of 100 STS-B pairs embedded by all-MiniLM-L6-v2 scored those pairs
    Spearman 0.3 where the raw cosine scores 86.1: ``benchmarks/small_whitening.py``). The
    covariance is then shrunk towards the identity by :func:`oas_shrinkage` (capped at
    :data:`MAX_AUTO_SHRINKAGE`), with a warning.
    """
    if shrinkage is not None:
        return float(shrinkage)
    d = len(eigvals)
    if n > d:
        return 0.0
    rho = min(oas_shrinkage(eigvals, n), MAX_AUTO_SHRINKAGE)
    value = rho / (1.0 - rho)
    logger.warning(
        "%s: %d sentences for %d dimensions make a singular covariance (rank <= %d), whose whitening would give "
        "every pair of fitting sentences the same cosine; shrinking it towards the identity instead (oracle "
        "approximating shrinkage, shrinkage_=%.3g). Fit on more sentences than dimensions to whiten fully, or "
        "pass shrinkage= to choose.",
        what,
        n,
        d,
        n - 1,
        value,
    )
    return value


def fit_spectrum(
    cov: np.ndarray, mean: np.ndarray, n: int, shrinkage: float | None, rcond: float, what: str
) -> tuple[np.ndarray, np.ndarray, float]:
    """The eigenvalues [k] (descending, after shrinkage) and eigenvectors [D, k] of the covariance [D, D] of ``n``
    rows of mean ``mean`` [D] that carry variance (eigenvalue above ``rcond`` times the largest), and the shrinkage
    used (:func:`singular_shrinkage`; ``what`` names the calibrator in its warning).

    InputError for a covariance with (almost) no variance: its largest standard deviation below
    :data:`SPREAD_RTOL` times the largest absolute coordinate of ``mean`` (rows equal up to float32 rounding; the
    moments path has no rows to compare).
    """
    eigvals, eigvecs = np.linalg.eigh(cov)  # ascending; symmetric, so eigh is exact and cheaper than SVD
    eigvals, eigvecs = eigvals[::-1].clip(min=0.0), eigvecs[:, ::-1]
    if not eigvals[0] > (SPREAD_RTOL * float(np.abs(mean).max())) ** 2:
        raise InputError(no_variance_message())
    shrinkage = singular_shrinkage(shrinkage, eigvals, n, what)
    if shrinkage > 0:
        eigvals = eigvals + shrinkage * eigvals.mean()
    # Descending, so the directions kept are a prefix: slices keep the fitted arrays C-ordered, as a loaded model's
    # are (a boolean index would copy them column-major, and matmuls then round differently from the loaded model).
    rank = int((eigvals > rcond * eigvals[0]).sum())
    return eigvals[:rank], eigvecs[:, :rank], shrinkage


def read_projection(arrays: dict[str, np.ndarray], d: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The saved ``mean`` [d], ``components`` [d, k] and ``explained_variance`` [k] of a projection, as float64."""
    return (
        expect_shape(arrays, "mean", (d,)).astype(np.float64),
        expect_shape(arrays, "components", (d, k)).astype(np.float64),
        expect_shape(arrays, "explained_variance", (k,)).astype(np.float64),
    )


@register("whitening")
class WhiteningCalibrator(Calibrator):
    r"""Whitening: :math:`\tilde x = (x - \mu) U_k \Lambda_k^{-1/2}` from the eigendecomposition of the covariance.

    With the defaults and more sentences than dimensions this is ``sklearn.decomposition.PCA(n_components,
    whiten=True)`` up to the sign of each output column (eigenvectors have no sign; cosines do not depend on
    it): same centring, same covariance (divided by N - 1), same scaling. It differs where PCA has no
    counterpart: ``shrinkage`` (automatic for N <= D), ``rcond`` (dropping directions without variance instead of
    amplifying them), and float32 output. ``tests/calibrators/test_whitening.py`` checks the equality.

    Args:
        n_components: keep the top k principal directions ("whitening-k", e.g. 256 for BERT-base); ``None``
            keeps every direction that carries variance.
        shrinkage: :math:`\lambda \ge 0`; whitens with :math:`(\Sigma + \lambda\,\bar s I)^{-1/2}` where
            :math:`\bar s` is the mean eigenvalue, interpolating between whitening (0) and mere centring and
            rotation (large). ``None`` (default): 0 when there are more sentences than dimensions, else chosen
            from the data (:func:`singular_shrinkage`: without it, N <= D sentences would all end up equidistant).
        rcond: directions whose eigenvalue is below ``rcond`` times the largest are dropped, not amplified.
            Real checkpoints have (near-)constant output dimensions (all-MiniLM-L6-v2 at 127, 223, 319);
            scaling their rounding noise up to unit variance would add pure-noise coordinates to the cosine.

    Attributes:
        mean_: [D]; components_: [D, k] W, ``transform(X) = (X - mean_) @ components_``; n_components_: k kept.
        explained_variance_: [k] eigenvalues (after shrinkage) of the kept directions, descending.
        shrinkage_: :math:`\lambda` actually used (``shrinkage``, or the automatic value for N <= D).

    References:
        Su et al., "Whitening Sentence Representations for Better Semantics and Faster Retrieval", 2021,
        arXiv:2103.15316.
    """

    rescales_variance = True
    specs = {
        "whitening": "BERT-whitening keeping every direction",
        "whitening-K": "BERT-whitening keeping the top K directions (e.g. whitening-256)",
    }
    affine = True

    def __init__(self, n_components: int | None = None, *, shrinkage: float | None = None, rcond: float = 1e-6) -> None:
        self.n_components = n_components
        self.shrinkage = shrinkage
        self.rcond = rcond

    def _validate_params(self, X: np.ndarray) -> None:
        d = X.shape[1]
        if self.n_components is not None and not (1 <= int(self.n_components) <= d):
            raise InputError(
                f"n_components must be between 1 and {d} (the embedding dimension), got {self.n_components}"
            )
        if (self.shrinkage is not None and self.shrinkage < 0) or not 0 <= self.rcond < 1:
            raise InputError("shrinkage must be >= 0 (or None: automatic) and rcond in [0, 1)")

    def _fit(self, X: np.ndarray) -> None:
        self.mean_, cov = mean_and_covariance(X)
        self._fit_covariance(cov, X.shape[0])

    def fit_from_moments(
        self, n: int, sum_x: np.ndarray, sum_outer: np.ndarray, *, shift: np.ndarray | None = None
    ) -> WhiteningCalibrator:
        r"""Fit from the sufficient statistics of ``n >= 2`` rows :math:`x_i` shifted by ``shift`` :math:`s` [D]
        (``None``: raw sums): ``sum_x`` :math:`\sum_i (x_i - s)` [D] and ``sum_outer`` :math:`\sum_i (x_i - s)(x_i -
        s)^T` [D, D], what distributed fitting all-reduces; returns ``self``. Equals :meth:`fit` on the rows up to
        rounding; a shift near the mean keeps the covariance's subtraction from cancelling digits. InputError for
        fewer than 2 rows, mismatched shapes, non-finite statistics or bad hyperparameters.
        """
        sum_x = np.asarray(sum_x, dtype=np.float64)
        sum_outer = np.asarray(sum_outer, dtype=np.float64)
        d = sum_x.shape[0] if sum_x.ndim == 1 else -1
        shift = np.zeros(d) if shift is None else np.asarray(shift, dtype=np.float64)
        if d < 1 or sum_outer.shape != (d, d) or shift.shape != (d,):
            raise InputError(
                f"moments must be sum_x [D], sum_outer [D, D] and shift [D]; got {sum_x.shape}, {sum_outer.shape} "
                f"and {shift.shape}"
            )
        if int(n) < 2:
            raise InputError(f"whitening needs at least 2 rows to estimate a covariance, got {n}")
        if not (np.isfinite(sum_x).all() and np.isfinite(sum_outer).all() and np.isfinite(shift).all()):
            raise InputError("the moments contain NaN or Inf; the embeddings they were summed from are broken")
        self.check_params(np.empty((0, d)))
        self._reset_fitted()
        n = int(n)
        delta = sum_x / n
        cov = (sum_outer - n * np.outer(delta, delta)) / (n - 1)
        self.mean_ = shift + delta
        # Summation order can leave the two triangles a rounding error apart; eigh reads only one of them.
        self._fit_covariance(0.5 * (cov + cov.T), n)
        self.n_features_in_ = d
        return self

    def _fit_covariance(self, cov: np.ndarray, n: int) -> None:
        """Set the fitted attributes other than ``mean_`` from the covariance [D, D] of ``n`` rows."""
        d = cov.shape[0]
        eigvals, eigvecs, self.shrinkage_ = fit_spectrum(cov, self.mean_, n, self.shrinkage, self.rcond, "whitening")
        rank = len(eigvals)
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

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        mean, components = as_tensor(self.mean_, device), as_tensor(self.components_, device)
        return lambda x: (x - mean) @ components

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Map whitened vectors back; exact when every direction was kept, a projection otherwise."""
        Z = check_latents(self, Z)
        # W = U / sqrt(s), so the inverse map U sqrt(s) is W * s.
        return (Z @ (self.components_ * self.explained_variance_).T + self.mean_).astype(np.float32)

    @property
    def n_features_out_(self) -> int:
        self.check_fitted()
        return self.n_components_

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays = {"mean": self.mean_, "components": self.components_, "explained_variance": self.explained_variance_}
        return {"n_components": self.n_components_, "shrinkage": float(self.shrinkage_)}, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        k = int(meta["n_components"])
        self.mean_, self.components_, self.explained_variance_ = read_projection(arrays, self.n_features_in_, k)
        self.n_components_ = k
        # Folders saved before shrinkage_ was recorded used the parameter (a number, 0 by default then).
        self.shrinkage_ = float(meta.get("shrinkage", self.shrinkage or 0.0))
