r"""``--calibrator auto``: one label-free rule for raw MLM encoders and contrastive sentence encoders alike.

The two kinds of encoder want opposite things. A raw masked-language-model encoder (the paper's setting) puts
its sentence embeddings in a narrow cone spanned by a few directions: full whitening (or the flow) gains 6 to 15
points there, and keeping any of the raw cosine costs points. A contrastively trained sentence encoder already
spreads its embeddings over many directions: whitening amplifies directions it did not use and loses points,
and :class:`AnchoredWhiteningCalibrator` (the raw cosine anchored, mixed with a partially whitened one) is the
rule that never falls below raw there.

What tells the two apart without labels is how concentrated the embeddings are, measured by two numbers of the
fitting embeddings: their *anisotropy* :math:`a` (the mean cosine of two random sentences, as in anchored
whitening) and their *spread* :math:`s`, the participation ratio of the covariance's eigenvalues over the
dimension, :math:`(\sum_i \lambda_i)^2 / (D \sum_i \lambda_i^2)` (1 when every direction carries the same
variance, 1/D when one does). A raw MLM encoder has both a strong common direction and variance in few
directions; a contrastive encoder may have one of the two (all-MiniLM-L6-v2's cls vectors are as anisotropic as
the raw encoder's mean-pooled ones, because of a few rogue coordinates, while their variance is spread out), not
both. The *concentration* :math:`c = a / s` separates them where each number alone barely does. Measured on every
fitting set of docs/beyond.md (each STS task's sentences, the train splits, the SNLI sentences; max_length 64):

========================================  ===============  ================  ================
encoder (poolings mean, first-last-avg,   anisotropy a     spread s          concentration c
last2avg, cls)
========================================  ===============  ================  ================
bert-gutenberg-L6-H384 (raw MLM)          0.51 - 0.93      0.055 - 0.118     4.3 - 16.6
all-MiniLM-L6-v2 (contrastive)            0.03 - 0.64      0.127 - 0.306     0.09 - 3.1
========================================  ===============  ================  ================

The rule moves smoothly, in log-concentration, from anchored whitening (:math:`c \le c_{lo}`, default 3.5) to full
whitening (:math:`c \ge c_{hi}`, default 4.0):

.. math:: t = \operatorname{clip}\Big(\frac{\log c - \log c_{lo}}{\log c_{hi} - \log c_{lo}}, 0, 1\Big),\quad
          \alpha = \tfrac12 + \tfrac12 t,\quad \beta = a + (1 - a)\,t.

At :math:`t = 1` the output's cosine is exactly BERT-whitening's; at :math:`t = 0` it is anchored whitening's.
The thresholds were set from the two encoders above (unlabeled embeddings only); all-mpnet-base-v2 is the check
on an encoder the rule was not set on (docs/beyond.md).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import InputError
from .anchored import AnchoredWhiteningCalibrator, anisotropy
from .registry import register
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
        low: concentration (anisotropy / spread) at and below which the calibrator is anchored whitening
            (default 3.5, above the contrastive encoders' 0.09 to 3.1).
        high: concentration at and above which it is full whitening (default 4.0, below the raw MLM encoder's
            4.3 to 16.6).
        rcond: directions whose eigenvalue is below ``rcond`` times the largest are dropped, not amplified.

    Attributes (besides :class:`AnchoredWhiteningCalibrator`'s):
        spread_: the spread of the fitting embeddings (:func:`spread`).
        concentration_: ``anisotropy_ / spread_``.
        rawness_: :math:`t` in [0, 1]: 0 = anchored whitening, 1 = full whitening.
        alpha_: the whitening strength the rule chose, ``0.5 + 0.5 * rawness_``.
    """

    specs = {
        "auto": "the recommendation: whitening on raw MLM encoders, anchored on sentence encoders, told apart by spread"
    }

    @classmethod
    def from_spec(cls, spec: str, number: int | None, **options: Any) -> AutoCalibrator:
        return cls()

    def __init__(self, *, low: float = 3.5, high: float = 4.0, rcond: float = 1e-6) -> None:
        self.low = low
        self.high = high
        self.rcond = rcond  # the parent's alpha and weight are not parameters here: the rule sets alpha_, weight_

    def _validate_params(self, X: np.ndarray) -> None:
        low, high = float(self.low), float(self.high)
        if not (np.isfinite(low) and np.isfinite(high) and 0.0 < low < high):
            raise InputError(f"need 0 < low < high (finite concentration thresholds), got {self.low}, {self.high}")
        if not 0 <= self.rcond < 1:
            raise InputError(f"rcond must be in [0, 1), got {self.rcond}")

    def _fit(self, X: np.ndarray) -> None:
        self.spread_ = spread(X)
        a = anisotropy(X)
        self.concentration_ = a / self.spread_ if self.spread_ > 0 else float("inf")
        low, high = np.log(float(self.low)), np.log(float(self.high))
        c = np.log(max(self.concentration_, 1e-12))
        self.rawness_ = float(np.clip((c - low) / (high - low), 0.0, 1.0))
        self.alpha_ = 0.5 + 0.5 * self.rawness_
        self._fit_mix(X, self.alpha_, a + (1.0 - a) * self.rawness_)
        chose = (
            "whitening (a raw-encoder-like space)"
            if self.rawness_ == 1.0
            else "anchored whitening (a sentence-encoder-like space)"
            if self.rawness_ == 0.0
            else f"{100 * self.rawness_:.0f}% of the way from anchored whitening to whitening"
        )
        logger.info(
            "auto: chose %s, since the concentration (anisotropy %.3f / spread %.3f) is %.2f: whitening at >= %s, "
            "anchored whitening at <= %s (alpha %.2f, weight %.3f)",
            chose,
            a,
            self.spread_,
            self.concentration_,
            self.high,
            self.low,
            self.alpha_,
            self.weight_,
        )

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super()._get_state()
        meta.update(
            spread=float(self.spread_),
            concentration=float(self.concentration_),
            alpha=float(self.alpha_),
            rawness=float(self.rawness_),
        )
        return meta, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super()._set_state(meta, arrays)
        self.spread_, self.concentration_ = float(meta["spread"]), float(meta["concentration"])
        self.alpha_, self.rawness_ = float(meta["alpha"]), float(meta["rawness"])
