r"""``--calibrator auto``: anchored whitening whose strength and mix follow label-free statistics.

Rawness :math:`t = \operatorname{clip}((a_{tok} - 0.40) / 0.10, 0, 1)` from the encoder's *token anisotropy*
:math:`a_{tok}` (the anisotropy of the fitting sentences' mean-pooled last-layer vectors, which ``Embedder.fit``
computes in the same forward pass; a plain ``fit(X)`` uses that of ``X``); whitening strength :math:`\alpha = 0.5 +
0.25\,t`; weight of the calibrated cosine :math:`\beta = a \cdot \min(1, N/D)`, the anisotropy of ``X`` times the
reliability of the covariance (a no-harm guard). With :math:`t \ge 0.5` ``Embedder.fit`` also switches a
token-averaging pooling to :data:`WEIGHTING`. docs/beyond.md has the measurements behind each choice.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import InputError
from .anchored import AnchoredWhiteningCalibrator, anisotropy
from .registry import calibrator_names, get_calibrator_class, register

logger = logging.getLogger(__name__)

#: The weighting ``auto`` gives a token-averaging pooling on a raw encoder (``sif`` = a 1e-3 over a + p(t)).
WEIGHTING = "sif"


def reliability(n: int, d: int) -> float:
    """``min(1, n / d)``: how much of the calibrated cosine a fit on ``n`` sentences of ``d`` dimensions earns."""
    return float(min(1.0, n / max(d, 1)))


def no_harm_warning(calibrator: Any, n: int, d: int) -> str | None:
    """A label-free warning that ``calibrator``, fitted on ``n`` sentences of ``d`` dimensions, is likely worse
    than the raw encoder on this data (a whitening-type calibrator on fewer than ``2 d`` sentences: docs/beyond.md),
    or ``None``; for ``auto``, which acts on the same statistic, what it did."""
    if isinstance(calibrator, AutoCalibrator):
        if calibrator.reliability_ >= 1.0:
            return None
        return (
            f"auto: {n} fitting sentences for {d} dimensions, too few to estimate every direction; it keeps "
            f"{100 * (1 - calibrator.weight_):.0f}% of the raw cosine (reliability {calibrator.reliability_:.2f}). "
            "Fit on more sentences than dimensions for a fuller calibration"
        )
    name = getattr(calibrator, "name", "")
    if n >= 2 * d or name not in calibrator_names():
        return None
    # Whitening-type: the registered class itself declares it (Calibrator.rescales_variance), never inherited.
    if not vars(get_calibrator_class(name)).get("rescales_variance", False):
        return None
    return (
        f"{name}: {n} fitting sentences for {d} dimensions: its calibrated space is likely worse than the raw "
        "encoder's (most directions are scaled from too few sentences); use --calibrator auto, which keeps part of "
        f"the raw cosine, or fit on at least {2 * d} sentences"
    )


@register("auto")
class AutoCalibrator(AnchoredWhiteningCalibrator):
    r"""The recommendation: anchored whitening whose strength, mix and weighting follow label-free statistics
    (the module docstring gives the rule); the output is :class:`AnchoredWhiteningCalibrator`'s (``2D`` columns at
    most).

    Args:
        low: token anisotropy at and below which the encoder is treated as a sentence encoder (rawness 0;
            default 0.40, above all-MiniLM-L6-v2's 0.03-0.35 on every fitting set measured).
        high: token anisotropy at and above which it is treated as a raw MLM encoder (rawness 1; default 0.50,
            below bert-gutenberg-L6-H384's 0.52-0.73).
        rcond: directions whose eigenvalue is below ``rcond`` times the largest are dropped, not amplified.

    Attributes (besides :class:`AnchoredWhiteningCalibrator`'s):
        token_anisotropy_: the statistic the rawness was read from (see ``rawness_source_``).
        rawness_source_: ``"token anisotropy"`` (given by ``Embedder.fit``) or ``"embedding anisotropy"`` (``X``'s).
        rawness_: :math:`t` in [0, 1]: 0 = sentence encoder, 1 = raw MLM encoder.
        reliability_: ``min(1, N / D)`` of the fit.
        alpha_: the whitening strength chosen, ``0.5 + 0.25 * rawness_``.
    """

    specs = {"auto": "the recommendation: anchored whitening set from label-free statistics (docs/beyond.md)"}

    def __init__(self, *, low: float = 0.40, high: float = 0.50, rcond: float = 1e-6) -> None:
        self.low = low
        self.high = high
        self.rcond = rcond  # the parent's alpha and weight are not parameters here: the rule sets alpha_, weight_

    def _validate_params(self, X: np.ndarray) -> None:
        low, high = float(self.low), float(self.high)
        if not 0.0 <= low < high <= 1.0:  # NaN fails too
            raise InputError(f"need 0 <= low < high <= 1 (token anisotropy thresholds), got {self.low}, {self.high}")
        if not 0 <= self.rcond < 1:
            raise InputError(f"rcond must be in [0, 1), got {self.rcond}")

    def rawness(self, token_anisotropy: float) -> float:
        """The rawness :math:`t` in [0, 1] this calibrator's thresholds give a token anisotropy."""
        low, high = float(self.low), float(self.high)
        return float(np.clip((float(token_anisotropy) - low) / (high - low), 0.0, 1.0))

    def fit(self, X: np.ndarray, y: object = None, *, token_anisotropy: float | None = None) -> AutoCalibrator:
        """Fit on embeddings ``X`` [N, D]; ``token_anisotropy``: the encoder's (see the module docstring), if known."""
        if token_anisotropy is not None and not 0.0 <= float(token_anisotropy) <= 1.0:
            raise InputError(f"token_anisotropy must be in [0, 1], got {token_anisotropy}")
        self._probe = token_anisotropy  # read by _fit only, during this call
        try:
            super().fit(X, y)
        finally:
            del self._probe
        logger.info("auto: %s", self.describe())
        return self

    def _fit(self, X: np.ndarray) -> None:
        probe = getattr(self, "_probe", None)
        self.rawness_source_ = "embedding anisotropy" if probe is None else "token anisotropy"
        self.token_anisotropy_ = float(anisotropy(X) if probe is None else probe)
        self.rawness_ = self.rawness(self.token_anisotropy_)
        self.reliability_ = reliability(X.shape[0], X.shape[1])
        self.alpha_ = 0.5 + 0.25 * self.rawness_
        self._fit_mix(X, self.alpha_, anisotropy(X) * self.reliability_)

    def describe(self) -> str:
        """One line: what the rule read and chose (for logs and the model card)."""
        self.check_fitted()
        kind = "a raw MLM encoder" if self.rawness_ >= 0.5 else "a sentence encoder"
        return (
            f"{self.rawness_source_} {self.token_anisotropy_:.3f} -> {kind} (rawness {self.rawness_:.2f}): "
            f"whitening strength alpha {self.alpha_:.2f}; calibrated-cosine weight {self.weight_:.3f} = anisotropy "
            f"{self.anisotropy_:.3f} x reliability {self.reliability_:.2f} (min(1, N/D))"
        )

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = super()._get_state()
        meta.update(
            token_anisotropy=float(self.token_anisotropy_),
            rawness_source=self.rawness_source_,
            rawness=float(self.rawness_),
            reliability=float(self.reliability_),
            alpha=float(self.alpha_),
        )
        return meta, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super()._set_state(meta, arrays)
        self.alpha_, self.rawness_ = float(meta["alpha"]), float(meta["rawness"])
        # Folders saved by the earlier concentration rule lack these: their transform is all that is needed.
        self.token_anisotropy_ = float(meta.get("token_anisotropy", float("nan")))
        self.rawness_source_ = str(meta.get("rawness_source", "concentration (earlier rule)"))
        self.reliability_ = float(meta.get("reliability", 1.0))
