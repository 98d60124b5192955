"""Silent wrong results (issue 13): each case of docs/robustness-silent.md fails loudly or does the right thing.

Every test here fails on the code before the fix: a degenerate fit that used to save a useless model, a corrupted
value that used to flow into similarities, an input that used to be read as something else.
"""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import (
    Embedder,
    FlowCalibrator,
    InputError,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.calibrators import (
    AllButTheTopCalibrator,
    AnchoredWhiteningCalibrator,
    ChainCalibrator,
    IdentityCalibrator,
    parse_calibrator,
)

from .conftest import SENTENCES

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]  # 64 distinct sentences


def _data(n: int = 200, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)


# -- 7: shapes, NaN in inverse_transform, NaN hyperparameters -----------------------------------------------


@pytest.mark.parametrize(
    ("calibrator", "width"),
    [(WhiteningCalibrator(5), 5), (AnchoredWhiteningCalibrator(), None), (IdentityCalibrator(), None)],
)
def test_encoding_no_sentences_has_the_calibrated_width(tiny_encoder, calibrator, width):
    model = Embedder(tiny_encoder, calibrator).fit(CORPUS)
    expected = model.calibrator_dim()
    assert width is None or expected == width
    assert model.encode([]).shape == (0, expected) == (0, model.encode(SENTENCES[:2]).shape[1])


@pytest.mark.parametrize(
    "calibrator",
    [
        IdentityCalibrator(),
        StandardNormCalibrator(),
        WhiteningCalibrator(),
        ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator()]),
        FlowCalibrator(max_steps=3),
    ],
    ids=lambda c: type(c).__name__,
)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_inverse_transform_refuses_nan_and_inf(calibrator, bad):
    x = _data(100, 8)
    z = calibrator.fit(x).transform(x[:3]).astype(np.float64)
    assert np.isfinite(calibrator.inverse_transform(z)).all()
    z[1, 2] = bad
    with pytest.raises(InputError, match="Z contain NaN or Inf .*row 1, column 2"):
        calibrator.inverse_transform(z)


@pytest.mark.parametrize(
    "calibrator",
    [
        WhiteningCalibrator(shrinkage=float("nan")),
        WhiteningCalibrator(shrinkage=float("inf")),
        WhiteningCalibrator(rcond=float("nan")),
        AnchoredWhiteningCalibrator(alpha=float("nan")),
        AnchoredWhiteningCalibrator(weight=float("nan")),
        FlowCalibrator(lr=float("nan")),
        FlowCalibrator(epochs=float("inf")),
        FlowCalibrator(weight_decay=float("nan")),
        ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator(shrinkage=float("nan"))]),
    ],
    ids=repr,
)
def test_nan_and_inf_hyperparameters_are_refused(calibrator):
    with pytest.raises(InputError, match="must be a finite number, got (nan|inf)"):
        calibrator.fit(_data(100, 8))


def test_nan_shrinkage_is_refused_by_the_moments_fit_too():
    x = _data(100, 8)
    with pytest.raises(InputError, match="shrinkage must be a finite number"):
        WhiteningCalibrator(shrinkage=float("nan")).fit_from_moments(len(x), x.sum(0), x.T @ x)


# -- 5: calibrated output checked for NaN, Inf and implausible magnitudes ------------------------------------


@pytest.mark.parametrize("corruption", ["1e35", "exponent bit", "nan"])
def test_a_corrupted_calibrator_weight_is_caught_not_scored(tiny_encoder, corruption):
    """One bad weight makes every vector point along one axis (every similarity 1.000000): refused instead,
    on the encoder's device path (Embedder.encode / iter_encode) and in Calibrator.transform."""
    model = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
    cal = model.calibrator
    healthy = model.encode(SENTENCES)
    assert np.abs(healthy).max() < 1e3
    if corruption == "1e35":
        cal.components_[3, 1] = 1e35
    elif corruption == "exponent bit":
        cal.components_[3, 1] *= 2.0**32  # what flipping the 6th exponent bit of a float does
    else:
        cal.components_[3, 1] = np.nan
    with pytest.raises(InputError, match=r"transform \(calibrator\) turned finite embeddings from .* column 1"):
        model.encode(SENTENCES)
    with pytest.raises(InputError, match="turned finite embeddings"):
        list(model.iter_encode(SENTENCES))
    with pytest.raises(InputError, match="WhiteningCalibrator turned finite embeddings into .* column 1"):
        cal.transform(tiny_encoder.encode(SENTENCES))


def test_large_but_plausible_outputs_pass(tiny_encoder):
    """Held-out rows far from the fitting data (10x their spread) still calibrate: the bound is not a tripwire."""
    x = _data(300, 16)
    cal = WhiteningCalibrator().fit(x)
    far = cal.mean_ + 10 * (x[:5] - cal.mean_)
    assert np.isfinite(cal.transform(far)).all()
    assert np.isfinite(Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS[:8]).encode(CORPUS)).all()
