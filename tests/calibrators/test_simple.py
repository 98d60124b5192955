"""The simple calibrators (bertflow.calibrators.simple) beyond the shared contract: standard-norm (equal to
scikit-learn's StandardScaler) and all-but-the-top."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

from bertflow import (
    AllButTheTopCalibrator,
    Embedder,
    InputError,
    StandardNormCalibrator,
)
from bertflow.calibrators import parse_calibrator

from ..conftest import SENTENCES
from .examples import _data


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


@pytest.mark.parametrize(("n", "k"), [(5, 10), (10, 9), (9, 8), (3, 2)])
def test_natsv_with_more_components_than_sentences_span_fails_at_fit(n, k):
    """n sentences span n - 1 directions: removing k >= n - 1 leaves nothing (k > n used to save a folder that
    bertflow refused to load)."""
    with pytest.raises(InputError, match=f"needs at least {k + 2} sentences"):
        AllButTheTopCalibrator(k).fit(_data(n, 32))
    with pytest.raises(InputError, match="between 1 and 31"):
        AllButTheTopCalibrator(32).fit(_data(100, 32))


def test_natsv_fitted_on_few_sentences_saves_and_loads(tiny_encoder, tmp_path):
    """The largest k that fits (n - 2) gives a folder that loads and encodes the same."""
    model = Embedder(tiny_encoder, parse_calibrator("natsv-6")).fit(SENTENCES)
    folder = model.save(tmp_path / "natsv")
    np.testing.assert_allclose(Embedder.load(folder).encode(SENTENCES), model.encode(SENTENCES), atol=1e-6)
