"""AutoCalibrator: the spread statistic, and the rule's two ends (whitening, anchored whitening) and its middle."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import InputError, WhiteningCalibrator
from bertflow.calibrators import AnchoredWhiteningCalibrator, AutoCalibrator, Calibrator, parse_calibrator
from bertflow.calibrators.auto import spread


def cos_matrix(Z: np.ndarray) -> np.ndarray:
    Z = np.asarray(Z, dtype=np.float64)
    Z = Z / np.linalg.norm(Z, axis=1, keepdims=True)
    return Z @ Z.T


def scaled(variances: np.ndarray, n: int = 2000, shift: float = 3.0, seed: int = 0) -> np.ndarray:
    """Gaussian rows with the given per-direction variances, randomly rotated and shifted off the origin."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(len(variances), len(variances))))
    return (rng.normal(size=(n, len(variances))) * np.sqrt(variances)) @ q.T + shift


def test_spread_is_one_for_isotropic_and_one_over_d_for_one_direction():
    d = 20
    assert spread(scaled(np.ones(d), n=20000)) == pytest.approx(1.0, abs=0.05)
    one = np.r_[1.0, np.full(d - 1, 1e-9)]
    assert spread(scaled(one)) == pytest.approx(1 / d, rel=0.05)
    # Exactly its definition on the covariance's eigenvalues.
    X = scaled(np.geomspace(1, 100, d))
    lam = np.linalg.eigvalsh(np.cov(X, rowvar=False))
    assert spread(X) == pytest.approx(lam.sum() ** 2 / (d * (lam**2).sum()), rel=1e-9)
    assert spread(np.ones((5, 3))) == 0.0


def test_narrow_cone_gets_full_whitening():
    # A few directions carry the variance and all rows share a direction (far from the origin): a raw MLM
    # encoder's geometry (spread ~0.08, anisotropy ~0.9).
    X = scaled(np.r_[np.full(3, 100.0), np.full(37, 0.3)], shift=10.0)
    auto = AutoCalibrator().fit(X)
    assert auto.concentration_ > 4.0
    assert auto.rawness_ == 1.0 and auto.alpha_ == 1.0 and auto.weight_ == 1.0
    np.testing.assert_allclose(
        cos_matrix(auto.transform(X[:50])), cos_matrix(WhiteningCalibrator().fit(X).transform(X[:50])), atol=1e-5
    )


def test_spread_out_embeddings_get_anchored_whitening():
    # Variance over many directions (spread ~0.5), even with a common direction: a contrastive encoder's geometry.
    X = scaled(np.geomspace(1, 10, 40))
    auto = AutoCalibrator().fit(X)
    assert auto.concentration_ < 3.5
    assert auto.rawness_ == 0.0 and auto.alpha_ == 0.5
    anchored = AnchoredWhiteningCalibrator().fit(X)
    assert auto.weight_ == pytest.approx(anchored.weight_)
    np.testing.assert_allclose(auto.transform(X[:50]), anchored.transform(X[:50]), atol=1e-6)


def test_concentration_not_anisotropy_alone_decides():
    # Strongly anisotropic (every row near one direction) but with variance spread over many directions, like
    # all-MiniLM-L6-v2's cls vectors: anchored, not full whitening.
    X = scaled(np.geomspace(1, 3, 40), shift=6.0)
    auto = AutoCalibrator().fit(X)
    assert auto.anisotropy_ > 0.5 and auto.spread_ > 0.5
    assert auto.rawness_ == 0.0


def test_between_the_thresholds_the_rule_interpolates():
    X = scaled(np.r_[np.full(3, 100.0), np.full(37, 0.3)], shift=10.0)
    c = AutoCalibrator().fit(X).concentration_
    auto = AutoCalibrator(low=c / 2, high=c * 2).fit(X)
    assert auto.rawness_ == pytest.approx(0.5)
    assert auto.alpha_ == pytest.approx(0.75)
    assert auto.weight_ == pytest.approx(auto.anisotropy_ + 0.5 * (1 - auto.anisotropy_))


def test_round_trip_keeps_the_choice(tmp_path):
    X = scaled(np.r_[np.full(3, 100.0), np.full(37, 0.3)], shift=10.0)
    auto = parse_calibrator("auto").fit(X)
    auto.save(tmp_path / "cal")
    back = Calibrator.load(tmp_path / "cal")
    assert isinstance(back, AutoCalibrator)
    for name in ("spread_", "concentration_", "alpha_", "rawness_", "weight_", "anisotropy_"):
        assert getattr(back, name) == getattr(auto, name), name
    np.testing.assert_array_equal(back.transform(X[:20]), auto.transform(X[:20]))


@pytest.mark.parametrize("low, high", [(4.0, 3.5), (0.0, 1.0), (1.0, float("inf")), (float("nan"), 2.0)])
def test_bad_thresholds_are_refused(low, high):
    with pytest.raises(InputError, match="low|high"):
        AutoCalibrator(low=low, high=high).fit(scaled(np.ones(5), n=50))
