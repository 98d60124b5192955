"""Output checks (validation.py): output_limit / check_calibrated let large but plausible outputs through."""

from __future__ import annotations

import numpy as np

from bertflow import (
    Embedder,
    StandardNormCalibrator,
    WhiteningCalibrator,
)

from .calibrators.examples import _data
from .conftest import CORPUS


def test_large_but_plausible_outputs_pass(tiny_encoder):
    """Held-out rows far from the fitting data (10x their spread) still calibrate: the bound is not a tripwire."""
    x = _data(300, 16)
    cal = WhiteningCalibrator().fit(x)
    far = cal.mean_ + 10 * (x[:5] - cal.mean_)
    assert np.isfinite(cal.transform(far)).all()
    assert np.isfinite(Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS[:8]).encode(CORPUS)).all()
