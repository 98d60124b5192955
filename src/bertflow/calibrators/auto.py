"""``--calibrator auto``: one label-free rule for raw MLM encoders and contrastive sentence encoders alike.

The two kinds of encoder want opposite things. A raw masked-language-model encoder (the paper's setting) puts
its sentence embeddings in a narrow cone spanned by a few directions: full whitening (or the flow) gains 6 to 15
points there, and keeping any of the raw cosine costs points. A contrastively trained sentence encoder already
spreads its embeddings over many directions: whitening amplifies directions it did not use and loses points,
and :class:`AnchoredWhiteningCalibrator` (the raw cosine anchored, mixed with a partially whitened one) is the
rule that never falls below raw there.

What tells the two apart without labels is how many directions the embeddings use: the *spread*, the
participation ratio of the covariance's eigenvalues divided by the dimension,
:math:`(\\sum_i \\lambda_i)^2 / (D \\sum_i \\lambda_i^2)` — 1 when every direction carries the same variance,
1/D when one does. Measured on the STS-B and SNLI sentences (docs/beyond.md): the raw MLM encoder
bert-gutenberg-L6-H384 gives 0.06 to 0.09 on every pooling; all-MiniLM-L6-v2 and all-mpnet-base-v2 give 0.14
to 0.28. Anisotropy (the mean cosine) does not separate them: MiniLM's cls vectors (0.54) are as anisotropic as
the raw encoder's mean-pooled ones (0.53), because a few rogue coordinates, not a narrow cone, make them so.

The rule moves smoothly, in log-spread, from anchored whitening (spread >= ``spread_high``) to full whitening
(spread <= ``spread_low``):

.. math:: t = \\operatorname{clip}\\Big(\\frac{\\log s_{hi} - \\log s}{\\log s_{hi} - \\log s_{lo}}, 0, 1\\Big),\\quad
          \\alpha = \\tfrac12 + \\tfrac12 t,\\quad \\beta = a + (1 - a)\\,t,

with :math:`a` the anisotropy. At :math:`t = 1` the output is exactly BERT-whitening's cosine; at :math:`t = 0`
it is anchored whitening's.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import InputError
from .anchored import AnchoredWhiteningCalibrator
from .base import register
from .whitening import mean_and_covariance

__all__ = ["AutoCalibrator", "spread"]

logger = logging.getLogger(__name__)


def spread(X: np.ndarray) -> float:
    r"""How evenly embeddings ``X`` [N, D] use their D directions: the covariance's participation ratio over D.

    :math:`(\sum_i \lambda_i)^2 / (D \sum_i \lambda_i^2)` for the covariance eigenvalues :math:`\lambda`,
    computed as :math:`\operatorname{tr}(C)^2 / (D \lVert C \rVert_F^2)` (no eigendecomposition). In (0, 1]:
    1 for isotropic data, 1/D when all the variance lies along one direction. 0.0 for constant data.
    """
    _, cov = mean_and_covariance(np.asarray(X, dtype=np.float64))
    frob = float((cov * cov).sum())
    return float(np.trace(cov) ** 2 / (cov.shape[0] * frob)) if frob > 0 else 0.0


@register("auto")
class AutoCalibrator(AnchoredWhiteningCalibrator):
    r"""Whitening for raw MLM encoders, anchored whitening for sentence encoders, chosen from unlabeled data.

    See the module docstring for the rule. The output is that of :class:`AnchoredWhiteningCalibrator` (``2D``
    columns at most: the unit raw vector and the unit partially whitened one, weighted), so it saves, loads and
    runs on the device the same way.

    Args:
        spread_low: spread at and below which the calibrator is full whitening (default 0.10, above the raw
            MLM encoder's 0.06 to 0.09).
        spread_high: spread at and above which it is anchored whitening (default 0.13, below the contrastive
            encoders' 0.14 to 0.28).
        rcond: directions whose eigenvalue is below ``rcond`` times the largest are dropped, not amplified.

    Attributes (besides :class:`AnchoredWhiteningCalibrator`'s):
        spread_: the spread of the fitting embeddings (:func:`spread`).
        alpha_: the whitening strength the rule chose.
        rawness_: :math:`t` in [0, 1]: 0 = anchored whitening, 1 = full whitening.
    """

    def __init__(self, *, spread_low: float = 0.10, spread_high: float = 0.13, rcond: float = 1e-6) -> None:
        self.spread_low = spread_low
        self.spread_high = spread_high
        self.rcond = rcond  # the parent's alpha and weight are not parameters here: the rule sets alpha_, weight_

    def _validate_params(self, X: np.ndarray) -> None:
        low, high = float(self.spread_low), float(self.spread_high)
        if not (np.isfinite(low) and np.isfinite(high) and 0.0 < low < high <= 1.0):
            raise InputError(f"need 0 < spread_low < spread_high <= 1, got {self.spread_low}, {self.spread_high}")
        if not 0 <= self.rcond < 1:
            raise InputError(f"rcond must be in [0, 1), got {self.rcond}")

    def _fit(self, X: np.ndarray) -> None:
        self.spread_ = spread(X)
        low, high = np.log(float(self.spread_low)), np.log(float(self.spread_high))
        s = np.log(max(self.spread_, 1e-12))
        self.rawness_ = float(np.clip((high - s) / (high - low), 0.0, 1.0))
        self.alpha_ = 0.5 + 0.5 * self.rawness_
        # The mix weight needs the anisotropy, which the parent computes; fit once with it, then set beta.
        self._fit_mix(X, self.alpha_, None)
        self.weight_ = self.anisotropy_ + (1.0 - self.anisotropy_) * self.rawness_
        logger.info(
            "auto: spread %.3f -> %.0f%% whitening (alpha %.2f, weight of the calibrated cosine %.3f)",
            self.spread_,
            100 * self.rawness_,
            self.alpha_,
            self.weight_,
        )

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super()._get_state()
        meta.update(spread=float(self.spread_), alpha=float(self.alpha_), rawness=float(self.rawness_))
        return meta, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super()._set_state(meta, arrays)
        self.spread_, self.alpha_, self.rawness_ = float(meta["spread"]), float(meta["alpha"]), float(meta["rawness"])
