"""AnchoredWhiteningCalibrator: the scikit-learn contract, persistence, and what its rule and boundaries do."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import InputError, NotFittedError, WhiteningCalibrator
from bertflow.calibrators import (
    AnchoredWhiteningCalibrator,
    Calibrator,
    calibrator_names,
    calibrator_specs,
    parse_calibrator,
)
from bertflow.calibrators.anchored import anisotropy
from bertflow.errors import ModelFileError


def cos_matrix(Z: np.ndarray) -> np.ndarray:
    Z = np.asarray(Z, dtype=np.float64)
    Z = Z / np.linalg.norm(Z, axis=1, keepdims=True)
    return Z @ Z.T


@pytest.fixture
def data() -> np.ndarray:
    """[300, 10] correlated data shifted away from the origin (anisotropic, like cls embeddings)."""
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 10)) @ rng.normal(size=(10, 10)) + 4.0


# -- contract ----------------------------------------------------------------------------------------------


def test_unfitted_raises(data):
    with pytest.raises(NotFittedError):
        AnchoredWhiteningCalibrator().transform(data)


def test_fit_returns_self_and_sets_trailing_underscore_attributes(data):
    cal = AnchoredWhiteningCalibrator()
    before = set(vars(cal))
    assert cal.fit(data) is cal
    added = {a for a in set(vars(cal)) - before if not a.startswith("_")}
    assert {"mean_", "components_", "explained_variance_", "anisotropy_", "weight_", "n_features_in_"} <= added
    assert all(a.endswith("_") for a in added), added
    out = cal.transform(data)
    assert out.dtype == np.float32 and out.shape == (300, cal.n_features_out_) == (300, 20)
    assert cal.transform(data[0]).shape == (20,)
    # Every output row has unit length: the two blocks weigh (1 - beta) and beta.
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_get_set_params_and_validation(data):
    cal = AnchoredWhiteningCalibrator(0.25, weight=0.3)
    assert cal.get_params() == {"alpha": 0.25, "weight": 0.3, "rcond": 1e-6}
    assert cal.set_params(alpha=0.75) is cal and cal.alpha == 0.75
    with pytest.raises(ValueError, match="Invalid parameter"):
        cal.set_params(beta=1)
    for bad in (AnchoredWhiteningCalibrator(1.5), AnchoredWhiteningCalibrator(weight=-0.1)):
        with pytest.raises(InputError):
            bad.fit(data)
    with pytest.raises(InputError, match="no variance"):
        AnchoredWhiteningCalibrator().fit(np.ones((5, 3)))


def test_save_load_round_trip(tmp_path, data):
    cal = AnchoredWhiteningCalibrator(0.25).fit(data)
    cal.save(tmp_path / "anchored")
    back = Calibrator.load(tmp_path / "anchored")
    assert isinstance(back, AnchoredWhiteningCalibrator)
    assert back.get_params() == cal.get_params()
    assert back.weight_ == cal.weight_ and back.anisotropy_ == cal.anisotropy_
    np.testing.assert_array_equal(back.transform(data), cal.transform(data))
    # An edited weight outside [0, 1] is refused on load.
    import json

    cfg_path = tmp_path / "anchored" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["state"]["weight"] = 2.0
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError):
        Calibrator.load(tmp_path / "anchored")


def test_spec_and_registry():
    assert "anchored" in calibrator_names() and "anchored" in calibrator_specs()
    assert parse_calibrator("anchored").get_params() == {"alpha": 0.5, "weight": None, "rcond": 1e-6}
    assert parse_calibrator("anchored-25").alpha == 0.25
    assert parse_calibrator("anchored-100").alpha == 1.0
    with pytest.raises(InputError):
        parse_calibrator("anchored-150")


# -- behaviour ---------------------------------------------------------------------------------------------


def test_cosine_is_the_convex_mix_of_raw_and_partially_whitened_cosine(data):
    cal = AnchoredWhiteningCalibrator(0.5, weight=0.3).fit(data)
    z = (data - cal.mean_) @ cal.components_
    expected = 0.7 * cos_matrix(data) + 0.3 * cos_matrix(z)
    np.testing.assert_allclose(cos_matrix(cal.transform(data)), expected, atol=1e-5)


def test_boundaries_raw_centring_and_whitening(data):
    # weight 0: exactly the raw cosine, whatever alpha.
    raw = AnchoredWhiteningCalibrator(1.0, weight=0.0).fit(data)
    np.testing.assert_allclose(cos_matrix(raw.transform(data)), cos_matrix(data), atol=1e-5)
    # alpha 0, weight 1: centring only.
    centred = AnchoredWhiteningCalibrator(0.0, weight=1.0).fit(data)
    np.testing.assert_allclose(cos_matrix(centred.transform(data)), cos_matrix(data - data.mean(0)), atol=1e-5)
    # alpha 1, weight 1: BERT-whitening.
    full = AnchoredWhiteningCalibrator(1.0, weight=1.0).fit(data)
    white = WhiteningCalibrator().fit(data)
    np.testing.assert_allclose(cos_matrix(full.transform(data)), cos_matrix(white.transform(data)), atol=1e-5)


def test_anisotropy_is_the_mean_pairwise_cosine(data):
    # Exact identity: the mean cosine over all N^2 ordered pairs equals |mean unit vector|^2.
    assert anisotropy(data) == pytest.approx(cos_matrix(data).mean(), abs=1e-12)
    rng = np.random.default_rng(1)
    # Symmetric around the origin: about 0 (1/N from the self-pairs). One direction for all: 1.
    assert anisotropy(rng.normal(size=(4000, 16))) < 0.01
    assert anisotropy(np.outer(rng.uniform(1, 2, size=50), np.ones(8))) == pytest.approx(1.0)


def test_rule_sets_weight_from_anisotropy_and_leaves_isotropic_data_nearly_raw():
    rng = np.random.default_rng(2)
    iso = rng.normal(size=(2000, 8)) * np.linspace(1, 3, 8)
    cone = iso + 10.0  # same spread, shifted far from the origin: raw cosines all near 1
    cal_iso = AnchoredWhiteningCalibrator().fit(iso)
    cal_cone = AnchoredWhiteningCalibrator().fit(cone)
    assert cal_iso.weight_ == cal_iso.anisotropy_ < 0.01
    assert cal_cone.weight_ == cal_cone.anisotropy_ > 0.9
    # Isotropic data: the output cosine is (almost) the raw one.
    np.testing.assert_allclose(cos_matrix(cal_iso.transform(iso[:50])), cos_matrix(iso[:50]), atol=0.02)
    # An explicit weight overrides the rule but anisotropy_ is still recorded.
    fixed = AnchoredWhiteningCalibrator(weight=0.4).fit(cone)
    assert fixed.weight_ == 0.4 and fixed.anisotropy_ == pytest.approx(cal_cone.anisotropy_)


def test_calibration_restores_the_spread_of_cosines_on_anisotropic_data():
    # In a narrow cone, raw cosines crowd near 1; the anchored cosine spreads them out again.
    rng = np.random.default_rng(3)
    cone = rng.normal(size=(500, 12)) + 8.0
    out = AnchoredWhiteningCalibrator().fit(cone).transform(cone)
    iu = np.triu_indices(500, 1)
    assert cos_matrix(out)[iu].std() > 5 * cos_matrix(cone)[iu].std()
