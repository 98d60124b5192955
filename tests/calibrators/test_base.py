"""The scikit-learn contract, checked for every calibrator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertflow import (
    AllButTheTopCalibrator,
    ChainCalibrator,
    FlowCalibrator,
    IdentityCalibrator,
    InputError,
    NotFittedError,
    StandardNormCalibrator,
    WhiteningCalibrator,
    parse_calibrator,
)
from bertflow.calibrators import Calibrator

from .examples import registry_instances


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


@pytest.mark.parametrize(
    ("spec", "cls", "attrs"),
    [
        ("none", IdentityCalibrator, {}),
        ("flow", FlowCalibrator, {"preset": "code"}),
        ("flow-paper", FlowCalibrator, {"preset": "paper"}),
        ("whitening", WhiteningCalibrator, {"n_components": None}),
        ("whitening-256", WhiteningCalibrator, {"n_components": 256}),
        ("standard-norm", StandardNormCalibrator, {}),
        ("natsv-6", AllButTheTopCalibrator, {"n_components": 6}),
        ("SN+NATSV-6", ChainCalibrator, {}),
    ],
)
def test_parse_calibrator(spec, cls, attrs):
    cal = parse_calibrator(spec)
    assert type(cal) is cls
    for k, v in attrs.items():
        assert getattr(cal, k) == v


def test_parse_calibrator_unknown():
    with pytest.raises(InputError, match="unknown calibrator"):
        parse_calibrator("pca-whatever")


def test_repr_shows_non_defaults():
    assert repr(WhiteningCalibrator(256)) == "WhiteningCalibrator(n_components=256)"
    assert repr(FlowCalibrator()) == "FlowCalibrator()"
