"""WhiteningCalibrator beyond the shared contract (test_base.py): identity covariance, constant dimensions, N <= D,
shrinkage, and the equality with scikit-learn's PCA(whiten=True)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA

from bertflow import WhiteningCalibrator


def test_whitening_gives_identity_covariance(anisotropic_data):
    z = WhiteningCalibrator().fit_transform(anisotropic_data).astype(np.float64)
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(z.shape[1]), atol=1e-4)
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-4)
    zk = WhiteningCalibrator(4).fit_transform(anisotropic_data).astype(np.float64)
    assert zk.shape[1] == 4
    np.testing.assert_allclose(np.cov(zk, rowvar=False), np.eye(4), atol=1e-4)


def test_whitening_drops_constant_dimensions(anisotropic_data):
    x = anisotropic_data.copy()
    x[:, 3] = 0.7  # constant, as all-MiniLM-L6-v2's dimensions 127, 223, 319
    x[:, 5] = 0.2 + 1e-12 * np.random.default_rng(1).normal(size=len(x))
    cal = WhiteningCalibrator().fit(x)
    z = cal.transform(x).astype(np.float64)
    assert cal.n_components_ == x.shape[1] - 2
    assert np.abs(z).max() < 100
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(z.shape[1]), atol=1e-4)


def test_whitening_fewer_samples_than_dimensions(caplog):
    x = np.random.default_rng(0).normal(size=(10, 30))
    # By default the singular covariance is shrunk (see tests/test_silent_results.py for why), with a warning.
    cal = WhiteningCalibrator().fit(x)
    assert cal.shrinkage_ > 0 and "singular covariance" in caplog.text
    assert np.isfinite(cal.transform(x)).all()
    # Asked for no shrinkage: the directions without variance are dropped, with a warning.
    caplog.clear()
    cal = WhiteningCalibrator(shrinkage=0).fit(x)
    assert cal.n_components_ <= 9 and cal.shrinkage_ == 0
    assert "only 10 samples" in caplog.text
    assert np.isfinite(cal.transform(x)).all()


def test_shrinkage_interpolates_towards_rotation(anisotropic_data):
    plain = WhiteningCalibrator().fit(anisotropic_data)
    strong = WhiteningCalibrator(shrinkage=1e6).fit(anisotropic_data)
    # Huge shrinkage: every direction is scaled alike, so cosines equal those of the centred data.
    z = strong.transform(anisotropic_data).astype(np.float64)
    c = anisotropic_data - anisotropic_data.mean(0)
    cos = lambda a: (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (a / np.linalg.norm(a, axis=1, keepdims=True)).T  # noqa: E731
    np.testing.assert_allclose(cos(z), cos(c), atol=1e-4)
    assert not np.allclose(cos(plain.transform(anisotropic_data).astype(np.float64)), cos(c), atol=1e-2)


@pytest.mark.parametrize("k", [None, 5])
def test_whitening_equals_pca_whiten_up_to_column_signs(anisotropic_data, k):
    ours = WhiteningCalibrator(k).fit_transform(anisotropic_data).astype(np.float64)
    theirs = PCA(n_components=k, whiten=True, svd_solver="full").fit_transform(anisotropic_data)
    signs = np.sign((ours * theirs).sum(axis=0))  # eigenvectors are defined up to sign
    assert (signs != 0).all()
    np.testing.assert_allclose(ours * signs, theirs, rtol=1e-4, atol=1e-4)
