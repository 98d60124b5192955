"""The simple calibrators (bertflow.calibrators.simple) beyond the shared contract: standard-norm (equal to
scikit-learn's StandardScaler) and all-but-the-top."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

from bertflow import AllButTheTopCalibrator, InputError, StandardNormCalibrator


def test_standard_norm(anisotropic_data):
    z = StandardNormCalibrator().fit_transform(anisotropic_data).astype(np.float64)
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(z.std(0), 1, atol=1e-5)


def test_all_but_the_top_nulls_top_directions(anisotropic_data):
    cal = AllButTheTopCalibrator(3).fit(anisotropic_data)
    z = cal.transform(anisotropic_data).astype(np.float64)
    np.testing.assert_allclose(z @ cal.components_.T, 0, atol=1e-3)
    np.testing.assert_allclose(cal.components_ @ cal.components_.T, np.eye(3), atol=1e-8)
    with pytest.raises(InputError, match="n_components"):
        AllButTheTopCalibrator(12).fit(anisotropic_data)


def test_standard_norm_equals_standard_scaler(anisotropic_data):
    ours = StandardNormCalibrator().fit_transform(anisotropic_data)
    theirs = StandardScaler().fit_transform(anisotropic_data)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
