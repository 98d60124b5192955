"""The calibrator contract (bertflow.calibrators.base.Calibrator), checked for every registered calibrator; what one
calibrator does beyond it is in test_<its module>.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from bertflow import (
    AllButTheTopCalibrator,
    FlowCalibrator,
    IdentityCalibrator,
    InputError,
    NotFittedError,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.calibrators import AnchoredWhiteningCalibrator, Calibrator, ChainCalibrator
from bertflow.calibrators.base import calibrator_fingerprint
from bertflow.errors import ModelFileError

from .examples import PROPERTY, _data, registry_instances


def make_all():
    """Every registered calibrator (one per declared spec: tests/calibrators/examples.py), then a few settings of
    interest beyond the specs."""
    return [
        *registry_instances({"flow": {"max_steps": 30}}),
        WhiteningCalibrator(6),
        WhiteningCalibrator(shrinkage=0.5),
        AllButTheTopCalibrator(2),
        FlowCalibrator("paper", coupling="affine", permutation="lu", max_steps=30),
    ]


def test_every_registered_calibrator_is_under_contract():
    from bertflow.calibrators import calibrator_names

    assert {c.name for c in make_all()} == set(calibrator_names())


IDS = [repr(c) for c in make_all()]
INVERTIBLE = (IdentityCalibrator, StandardNormCalibrator, WhiteningCalibrator, FlowCalibrator)


@pytest.fixture(params=range(len(IDS)), ids=IDS)
def calibrator(request) -> Calibrator:
    return make_all()[request.param]


def test_unfitted_raises(calibrator, anisotropic_data):
    assert not calibrator.is_fitted
    with pytest.raises(NotFittedError, match="not fitted"):
        calibrator.transform(anisotropic_data)
    # NotFittedError is both ValueError and AttributeError, as in scikit-learn.
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)


def test_fit_returns_self_and_sets_underscore_attributes(calibrator, anisotropic_data):
    before = set(vars(calibrator))
    assert calibrator.fit(anisotropic_data) is calibrator
    added = set(vars(calibrator)) - before
    public = {a for a in added if not a.startswith("_")}
    assert "n_features_in_" in public
    assert all(a.endswith("_") for a in public), public
    assert added == public, added - public  # every fitted attribute is one fit() resets (scikit-learn's rule)
    assert calibrator.n_features_in_ == anisotropic_data.shape[1]


def test_params_roundtrip(calibrator):
    params = calibrator.get_params()
    clone = type(calibrator)(**params)
    assert clone.get_params() == params
    with pytest.raises(ValueError, match="Invalid parameter"):
        calibrator.set_params(not_a_param=1)


def test_transform_matches_fit_transform_and_is_float32(calibrator, anisotropic_data):
    a = calibrator.fit_transform(anisotropic_data)
    b = calibrator.transform(anisotropic_data)
    assert a.dtype == np.float32 and a.shape == (len(anisotropic_data), calibrator.n_features_out_)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(calibrator.transform(anisotropic_data[3]), b[3], rtol=1e-6, atol=1e-6)


def test_torch_transform_is_the_same_map(calibrator, anisotropic_data):
    """The torch version (what Embedder and the encoder run on the device) equals transform to float32 rounding,
    and keeps its own copy of the fitted state."""
    x = anisotropic_data.copy()
    x[:, 3] = 0.5  # a constant dimension: the flow's passthrough and whitening's dropped direction
    calibrator.fit(x)
    fn = calibrator.torch_transform("cpu")
    ref = calibrator.transform(x)
    got = fn(torch.from_numpy(x))
    assert got.dtype == torch.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    calibrator.fit(x[::-1] * 2.0)  # refitting leaves the function built before unchanged
    np.testing.assert_array_equal(fn(torch.from_numpy(x)).numpy(), got.numpy())


def test_torch_transform_of_a_calibrator_without_one_round_trips_through_numpy(anisotropic_data):
    class Doubling(IdentityCalibrator):
        _torch_transform = Calibrator._torch_transform

        def _transform(self, X):
            return 2 * X

    fn = Doubling().fit(anisotropic_data).torch_transform()
    np.testing.assert_allclose(fn(torch.from_numpy(anisotropic_data)).numpy(), 2 * anisotropic_data, rtol=1e-6)
    with pytest.raises(NotFittedError):
        IdentityCalibrator().torch_transform()


def test_inverse_transform(calibrator, anisotropic_data):
    if not isinstance(calibrator, INVERTIBLE) or getattr(calibrator, "n_components", None):
        pytest.skip("not invertible")
    z = calibrator.fit_transform(anisotropic_data)
    np.testing.assert_allclose(calibrator.inverse_transform(z), anisotropic_data, rtol=1e-4, atol=1e-3)


def test_save_load_roundtrip(calibrator, anisotropic_data, tmp_path):
    calibrator.fit(anisotropic_data)
    calibrator.save(tmp_path / "cal")
    loaded = Calibrator.load(tmp_path / "cal")
    assert type(loaded) is type(calibrator)
    np.testing.assert_array_equal(loaded.transform(anisotropic_data), calibrator.transform(anisotropic_data))
    # On the device path too (what Embedder.encode runs): a fitted array whose memory order differs from the loaded
    # one's (column-major from a boolean index) makes torch's matmul round differently, by ~1e-7.
    x = torch.from_numpy(anisotropic_data)
    torch.testing.assert_close(loaded.torch_transform("cpu")(x), calibrator.torch_transform("cpu")(x), rtol=0, atol=0)


def test_rejects_bad_input(calibrator, anisotropic_data):
    with pytest.raises(InputError, match="2-D"):
        calibrator.fit(anisotropic_data[0][None, None])
    calibrator.fit(anisotropic_data)
    with pytest.raises(InputError, match="features"):
        calibrator.transform(anisotropic_data[:, :5])
    bad = anisotropic_data.copy()
    bad[7, 2] = np.nan
    with pytest.raises(InputError, match="row 7, column 2"):
        calibrator.transform(bad)
    bad[7, 2] = np.inf
    with pytest.raises(InputError, match="NaN or Inf"):
        type(calibrator)(**calibrator.get_params()).fit(bad)


def test_repr_shows_non_defaults():
    assert repr(WhiteningCalibrator(256)) == "WhiteningCalibrator(n_components=256)"
    assert repr(FlowCalibrator()) == "FlowCalibrator()"


def test_calibrator_fingerprint_ignores_runtime_and_versions_not_fitted_numbers(
    anisotropic_data, tmp_path, monkeypatch
):
    import bertflow.calibrators.base

    cal = WhiteningCalibrator(4).fit(anisotropic_data)
    before = calibrator_fingerprint(cal)
    cal.save(tmp_path / "cal")
    assert calibrator_fingerprint(Calibrator.load(tmp_path / "cal")) == before
    monkeypatch.setattr(bertflow.calibrators.base, "__version__", "99.0.0")  # to_config records the version
    assert calibrator_fingerprint(cal) == before
    cal.mean_ = cal.mean_ + 1e-9  # one fitted number
    assert calibrator_fingerprint(cal) != before


def test_a_calibrator_of_a_newer_format_is_refused_as_a_model_file_error(anisotropic_data, tmp_path):
    WhiteningCalibrator().fit(anisotropic_data).save(tmp_path / "cal")
    config_path = tmp_path / "cal" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "format_version": 99}))
    with pytest.raises(ModelFileError, match=r"cal/config.json is a calibrator written by .* upgrade bertflow"):
        Calibrator.load(tmp_path / "cal")


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


@pytest.mark.parametrize("noise", [0.0, 1e-7])
def test_identical_rows_are_refused_by_every_calibrator(noise):
    """Rows equal up to float32 rounding count as equal; the moments (distributed) path refuses them too."""
    rng = np.random.default_rng(0)
    x = np.tile(rng.normal(size=(1, 16)), (64, 1)) * (1 + noise * rng.normal(size=(64, 16)))
    for cal in (WhiteningCalibrator(), StandardNormCalibrator(), AllButTheTopCalibrator(2), FlowCalibrator()):
        with pytest.raises(InputError, match="all equal"):
            cal.fit(x)
    with pytest.raises(InputError, match="all equal"):
        WhiteningCalibrator().fit_from_moments(len(x), x.sum(0), x.T @ x)
    assert IdentityCalibrator().fit(x).transform(x).shape == x.shape  # the identity needs no variance


@given(n=st.integers(40, 120), d=st.integers(2, 12), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 10_000))
@PROPERTY
def test_linear_calibrators_invert(n, d, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)) * scale
    for cal in (StandardNormCalibrator(), WhiteningCalibrator(rcond=1e-9)):
        z = cal.fit_transform(x)
        if z.shape[1] == d:
            np.testing.assert_allclose(cal.inverse_transform(z), x, rtol=1e-3, atol=1e-3 * scale)
