"""WhiteningCalibrator beyond the shared contract (test_base.py): identity covariance, constant dimensions, N <= D,
shrinkage, and the equality with scikit-learn's PCA(whiten=True)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA

from bertflow import (
    InputError,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.calibrators import (
    AnchoredWhiteningCalibrator,
    ChainCalibrator,
)

from .examples import _data


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
    # By default the singular covariance is shrunk (test_whitening_fewer_sentences_than_dimensions_keeps_the_similarity_
    # structure below says why), with a warning.
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


def test_nan_shrinkage_is_refused_by_the_moments_fit_too():
    x = _data(100, 8)
    with pytest.raises(InputError, match="shrinkage must be a finite number"):
        WhiteningCalibrator(shrinkage=float("nan")).fit_from_moments(len(x), x.sum(0), x.T @ x)


def _low_rank_data(n: int, seed: int, d: int = 64) -> np.ndarray:
    """Embeddings with 8 meaningful directions of decreasing spread, isotropic noise and an offset, [n, d]."""
    rng = np.random.default_rng(seed)
    mixing = np.random.default_rng(99).normal(size=(8, d)) * np.linspace(3.0, 0.5, 8)[:, None]
    return rng.normal(size=(n, 8)) @ mixing + 0.3 * rng.normal(size=(n, d)) + 0.5


def _pair_cosines(z: np.ndarray) -> np.ndarray:
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    return (u @ u.T)[np.triu_indices(len(z), 1)]


@pytest.mark.parametrize(
    "make",
    [
        WhiteningCalibrator,
        lambda: WhiteningCalibrator(32),
        lambda: AnchoredWhiteningCalibrator(1.0, weight=1.0),  # the calibrated cosine alone, fully whitened
        lambda: ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator()]),
    ],
    ids=["whitening", "whitening-32", "anchored-100-alone", "sn+whitening"],
)
def test_whitening_fewer_sentences_than_dimensions_keeps_the_similarity_structure(make, caplog):
    """40 sentences in 64 dimensions: whitening the singular covariance used to put all 40 at the same cosine of
    each other (Spearman with the raw cosines: 0.0 on them, 0.28 on held-out sentences; on STS-B, 0.3 where the
    raw cosine scores 86.1, benchmarks/small_whitening.py). The covariance is now shrunk (with a warning and
    ``shrinkage_``): measured 0.8 here,
    required above 0.6, on the fitting sentences and on held-out ones."""
    from scipy.stats import spearmanr

    fitting, held_out = _low_rank_data(40, seed=0), _low_rank_data(60, seed=1)
    cal = make().fit(fitting)
    assert "40 sentences for 64 dimensions make a singular covariance" in caplog.text
    whitening = cal.steps_[-1] if isinstance(cal, ChainCalibrator) else cal
    assert whitening.shrinkage_ > 0
    for x in (fitting, held_out):
        calibrated = _pair_cosines(cal.transform(x).astype(np.float64))
        assert calibrated.std() > 0.1  # not collapsed onto one value
        assert spearmanr(calibrated, _pair_cosines(x))[0] > 0.6


def test_shrinkage_is_saved_and_explicit_zero_still_means_none(tmp_path):
    """The automatic value is a fitted attribute that survives save/load; more rows than dimensions whiten fully."""
    cal = WhiteningCalibrator().fit(_low_rank_data(40, seed=0))
    cal.save(tmp_path / "w")
    loaded = WhiteningCalibrator.load(tmp_path / "w")
    assert loaded.shrinkage_ == cal.shrinkage_ > 0
    assert WhiteningCalibrator().fit(_low_rank_data(200, seed=0)).shrinkage_ == 0
    assert WhiteningCalibrator(shrinkage=0).fit(_low_rank_data(40, seed=0)).shrinkage_ == 0
