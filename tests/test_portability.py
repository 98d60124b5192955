"""Which fitted calibrators export as sentence-transformers' own modules (no bertflow needed to load), and the
one-sentence reason for the others."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow.calibrators import AnchoredWhiteningCalibrator, FlowCalibrator, WhiteningCalibrator
from bertflow.errors import NotFittedError
from bertflow.portability import anchored_parts, calibrator_needs_bertflow


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32) + 1.0


def test_affine_calibrators_need_nothing_after_any_pooling(x):
    whitening = WhiteningCalibrator().fit(x)
    assert anchored_parts(whitening) is None
    for pooling in ("mean", "cls", "sif:first-last-avg", None):
        assert calibrator_needs_bertflow(whitening, pooling) is None


def test_anchored_exports_after_token_averaging_poolings_only(x):
    anchored = AnchoredWhiteningCalibrator().fit(x)
    mean, w, b = anchored_parts(anchored)
    assert mean.shape == (8,) and w.shape[0] == 8 and 0.0 <= b <= 1.0
    assert calibrator_needs_bertflow(anchored, "mean") is None
    assert calibrator_needs_bertflow(anchored, "sif:first-last-avg") is None
    assert "not affine" in calibrator_needs_bertflow(anchored, "cls")
    assert "from_embedder" in calibrator_needs_bertflow(anchored, None)  # a sentence-transformers model's pooling
    with pytest.raises(NotFittedError):
        anchored_parts(AnchoredWhiteningCalibrator())


def test_a_flow_needs_bertflow(x):
    flow = FlowCalibrator(epochs=1, seed=0).fit(x)
    assert anchored_parts(flow) is None
    reason = calibrator_needs_bertflow(flow, "mean")
    assert reason.startswith("the `flow` calibrator is a normalizing flow")
