"""Distributed fitting as one rank (bertflow.scale.fit): exact moments, whitening from moments, the flow fit."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import FlowCalibrator, WhiteningCalibrator
from bertflow.errors import InputError
from bertflow.scale.fit import all_reduce_moments, fit_flow_distributed, fit_whitening_distributed
from bertflow.scale.store import write_store


def test_moments_are_exact(anisotropic32):
    x = anisotropic32.astype(np.float64) + 1e4  # a large mean: raw sums would cancel digits, shifted ones do not
    m = all_reduce_moments(np.array_split(x, 7), 12, outer=True)
    assert m.n == 600
    np.testing.assert_allclose(m.mean, x.mean(0), rtol=1e-14)
    np.testing.assert_allclose(m.std, x.std(0), rtol=1e-9, atol=1e-12)
    centred = x - x.mean(0)
    cov = (m.sum_outer - m.n * np.outer(m.sum / m.n, m.sum / m.n)) / (m.n - 1)
    np.testing.assert_allclose(cov, centred.T @ centred / 599, rtol=1e-9, atol=1e-12)
    assert m.abs_max == np.abs(x).max()
    with pytest.raises(InputError, match="NaN"):
        all_reduce_moments([np.full((2, 12), np.nan)], 12)


def test_whitening_from_moments_equals_fit(anisotropic32):
    ref = WhiteningCalibrator(shrinkage=0.1).fit(anisotropic32)
    got = fit_whitening_distributed(anisotropic32, WhiteningCalibrator(shrinkage=0.1), chunk_rows=64)
    np.testing.assert_allclose(got.mean_, ref.mean_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.explained_variance_, ref.explained_variance_, rtol=1e-10)
    sign = np.sign((got.components_ * ref.components_).sum(0))
    np.testing.assert_allclose(got.components_ * sign, ref.components_, rtol=0, atol=1e-10)
    with pytest.raises(InputError, match="at least 2 rows"):
        WhiteningCalibrator().fit_from_moments(1, np.zeros(3), np.zeros((3, 3)))
    with pytest.raises(InputError, match="n_components"):
        WhiteningCalibrator(20).fit_from_moments(10, np.zeros(3), np.eye(3))


def test_one_rank_flow_fit_matches_fit(anisotropic32, tmp_path):
    store = write_store(anisotropic32, tmp_path / "x", shard_size=50)
    config = dict(epochs=2, validation_fraction=0.1, eval_every=4, seed=3)
    ref = FlowCalibrator(**config).fit(anisotropic32)
    got = fit_flow_distributed(store, FlowCalibrator(**config), device="cpu", read_steps=3)
    assert got.passthrough_.tolist() == ref.passthrough_.tolist() == [7]
    assert (got.n_steps_, got.best_step_) == (ref.n_steps_, ref.best_step_)
    np.testing.assert_allclose(got.history_["train_bpd"], ref.history_["train_bpd"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.transform(anisotropic32), ref.transform(anisotropic32), atol=1e-4)
    # Fitted like any calibrator: it saves and loads.
    got.save(tmp_path / "cal")
    np.testing.assert_array_equal(
        FlowCalibrator.load(tmp_path / "cal").transform(anisotropic32[:5]), got.transform(anisotropic32[:5])
    )
