"""ChainCalibrator beyond the shared contract: the steps in sequence, clones and steps as scikit-learn parameters."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from bertflow import AllButTheTopCalibrator, ChainCalibrator, InputError, StandardNormCalibrator, WhiteningCalibrator


def test_chain_equals_steps_in_sequence(anisotropic_data):
    chain = ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator(5)]).fit(anisotropic_data)
    sn = StandardNormCalibrator().fit(anisotropic_data)
    wh = WhiteningCalibrator(5).fit(sn.transform(anisotropic_data).astype(np.float64))
    np.testing.assert_allclose(
        chain.transform(anisotropic_data), wh.transform(sn.transform(anisotropic_data)), atol=1e-4
    )
    assert chain.n_features_out_ == 5
    with pytest.raises(InputError, match="at least one step"):
        ChainCalibrator([]).fit(anisotropic_data)


def test_clone_of_a_chain_is_unfitted_and_independent(anisotropic_data):
    steps = [StandardNormCalibrator(), WhiteningCalibrator(4)]
    chain = ChainCalibrator(steps).fit(anisotropic_data)
    # fit leaves the steps given untouched (it fits clones, kept in steps_), as scikit-learn's meta-estimators do.
    assert not steps[0].is_fitted and not steps[1].is_fitted
    assert chain.steps_[1].n_components_ == 4 and chain.steps_[0] is not steps[0]
    copy = clone(chain)
    assert not copy.is_fitted and copy.steps[1].get_params() == steps[1].get_params()
    assert copy.steps[1] is not steps[1]
    np.testing.assert_array_equal(copy.fit_transform(anisotropic_data), chain.transform(anisotropic_data))


def test_chain_loaded_from_disk_has_its_steps_as_parameters(anisotropic_data, tmp_path):
    chain = ChainCalibrator([StandardNormCalibrator(), AllButTheTopCalibrator(2)]).fit(anisotropic_data)
    chain.save(tmp_path / "chain")
    loaded = ChainCalibrator.load(tmp_path / "chain")
    assert [type(s) for s in loaded.steps] == [StandardNormCalibrator, AllButTheTopCalibrator]
    assert loaded.steps[1].n_components == 2 and not loaded.steps[1].is_fitted
    np.testing.assert_array_equal(
        clone(loaded).fit(anisotropic_data).transform(anisotropic_data), chain.transform(anisotropic_data)
    )
