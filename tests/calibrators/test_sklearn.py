"""Calibrators are scikit-learn transformers: the estimator checks, clone, Pipeline, GridSearchCV, set_output,
feature names (the equalities with StandardScaler and PCA are in test_simple.py and test_whitening.py)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from bertflow.calibrators import (
    AllButTheTopCalibrator,
    AnchoredWhiteningCalibrator,
    Calibrator,
    ChainCalibrator,
    FlowCalibrator,
    StandardNormCalibrator,
    WhiteningCalibrator,
)

from .examples import registry_instances

#: The flow's checks fit it dozens of times; a handful of steps keeps them fast and exercises the same code.
#: The checks fit on 10 to 30 rows of 2 to 10 features: one level (two would need 4 features), min_samples lowered.
FAST_FLOW = {"n_levels": 1, "depth": 2, "max_steps": 3, "init_samples": 64, "min_samples": 2, "device": "cpu"}

#: Every registered calibrator, one per declared spec (tests/calibrators/examples.py), and a few more settings.
ESTIMATORS = [
    *registry_instances({"flow": FAST_FLOW}),
    WhiteningCalibrator(2, shrinkage=0.1),
    FlowCalibrator(),  # the defaults, with each check they cannot pass and why (DEFAULT_FLOW_LIMITS)
]


def test_every_registered_calibrator_is_checked():
    from bertflow.calibrators import calibrator_names

    assert {c.name for c in ESTIMATORS} == set(calibrator_names())


#: Checks that do not hold for bertflow's calibrators by design; each reason is the design decision.
SKIPPED = {
    "check_fit2d_predict1d": (
        "transform accepts one embedding [D] and returns one calibrated vector [D'] (documented convenience for a "
        "single sentence); scikit-learn's transformers refuse 1-D input"
    ),
}


_TOO_FEW_ROWS = (
    "FlowCalibrator() refuses fewer than min_samples=32 rows (a density fitted on fewer is noise; that check comes "
    "first), and this check fits on 10 to 30 rows; FAST_FLOW (min_samples=2) passes it"
)
_TOO_FEW_FEATURES = (
    "FlowCalibrator() is the paper's 3-level Glow: each level halves the channels, so it needs at least 8 features "
    "and refuses the 2 to 4 this check fits on (a one-line InputError); FAST_FLOW (n_levels=1) passes it"
)
#: The checks that FlowCalibrator() with its defaults fails, and why (issue 25: 24 of 47 failed unexplained).
DEFAULT_FLOW_LIMITS = {
    **{
        name: _TOO_FEW_ROWS
        for name in (
            "check_fit_score_takes_y",
            "check_estimators_overwrite_params",
            "check_dont_overwrite_parameters",
            "check_estimators_fit_returns_self",
            "check_readonly_memmap_input",
            "check_n_features_in_after_fitting",
            "check_estimators_dtypes",
            "check_estimators_empty_data_messages",
            "check_pipeline_consistency",
            "check_estimators_nan_inf",
            "check_estimators_pickle",
            "check_f_contiguous_array_estimator",
            "check_transformer_data_not_an_array",
            "check_transformer_general",
            "check_transformer_preserve_dtypes",
            "check_methods_sample_order_invariance",
            "check_methods_subset_invariance",
            "check_fit2d_1feature",
            "check_dict_unchanged",
        )
    },
    **{
        name: _TOO_FEW_FEATURES
        for name in (
            "check_fit_idempotent",
            "check_fit_check_is_fitted",
            "check_n_features_in",
            "check_positive_only_tag_during_fit",
        )
    },
}


def expected_failed_checks(estimator) -> dict[str, str]:
    if isinstance(estimator, FlowCalibrator) and estimator.get_params() == FlowCalibrator().get_params():
        return {**DEFAULT_FLOW_LIMITS, **SKIPPED}
    return dict(SKIPPED)  # the same for every calibrator


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks, xfail_strict=True)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# -- beyond the generic checks -------------------------------------------------------------------------------


def test_not_fitted_error_is_scikit_learns(anisotropic_data):
    with pytest.raises(SklearnNotFittedError):
        WhiteningCalibrator().transform(anisotropic_data)


def test_output_is_float32_for_float64_input_as_documented(anisotropic_data):
    cal = WhiteningCalibrator().fit(anisotropic_data.astype(np.float64))
    assert cal.transform(anisotropic_data.astype(np.float64)).dtype == np.float32
    assert cal.__sklearn_tags__().transformer_tags.preserves_dtype == ["float32"]
    assert "float32" in Calibrator.__doc__ and "float32" in Calibrator.transform.__doc__


def test_feature_names_out(anisotropic_data):
    d = anisotropic_data.shape[1]
    sn = StandardNormCalibrator().fit(anisotropic_data)
    assert list(sn.get_feature_names_out()) == [f"x{i}" for i in range(d)]
    names = [f"dim{i}" for i in range(d)]
    assert list(AllButTheTopCalibrator(2).fit(anisotropic_data).get_feature_names_out(names)) == names
    wh = WhiteningCalibrator(4).fit(anisotropic_data)
    assert list(wh.get_feature_names_out()) == [f"whiteningcalibrator{i}" for i in range(4)]
    anchored = AnchoredWhiteningCalibrator().fit(anisotropic_data)
    n_out = anchored.transform(anisotropic_data).shape[1]
    assert len(anchored.get_feature_names_out()) == anchored.n_features_out_ == n_out
    chain = ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator(3)]).fit(anisotropic_data)
    assert list(chain.get_feature_names_out()) == [f"whiteningcalibrator{i}" for i in range(3)]
    assert list(ChainCalibrator([StandardNormCalibrator()]).fit(anisotropic_data).get_feature_names_out(names)) == names
    with pytest.raises(ValueError):
        sn.get_feature_names_out(names[:3])  # wrong count, as scikit-learn refuses


def test_set_output(anisotropic_data):
    cal = WhiteningCalibrator(3).set_output(transform="default")
    assert isinstance(cal.fit_transform(anisotropic_data), np.ndarray)
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(anisotropic_data, columns=[f"d{i}" for i in range(anisotropic_data.shape[1])])
    out = StandardNormCalibrator().set_output(transform="pandas").fit(frame).transform(frame)
    assert list(out.columns) == list(frame.columns)


def test_pipeline_and_grid_search_supervised(anisotropic_data):
    """A toy supervised pipeline: the target depends on the data's low-variance directions, which whitening
    brings to unit scale; the grid search must find the n_components that keeps them."""
    from sklearn.linear_model import Ridge

    x = anisotropic_data
    low = WhiteningCalibrator().fit(x).transform(x)[:, -1].astype(np.float64)  # the weakest direction
    y = low + 0.01 * np.random.default_rng(1).normal(size=len(x))
    pipe = make_pipeline(ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator()]), Ridge(alpha=1.0))
    grid = {"chaincalibrator__steps": [[WhiteningCalibrator(2)], [WhiteningCalibrator()]]}
    search = GridSearchCV(pipe, grid, cv=3).fit(x, y)
    assert search.best_params_["chaincalibrator__steps"][0].n_components is None
    assert search.best_score_ > 0.9
    grid = {"whiteningcalibrator__n_components": [2, None]}
    search = GridSearchCV(make_pipeline(WhiteningCalibrator(), Ridge()), grid, cv=3)
    assert search.fit(x, y).best_params_ == {"whiteningcalibrator__n_components": None}


def test_grid_search_without_labels_uses_the_flows_likelihood(anisotropic_data):
    """GridSearchCV with no y and no scoring ranks by ``FlowCalibrator.score`` (held-out log-likelihood)."""
    x = anisotropic_data
    flow = FlowCalibrator(n_levels=1, depth=1, hidden_channels=8, max_steps=2, device="cpu")
    search = GridSearchCV(flow, {"max_steps": [1, 60]}, cv=2).fit(x)
    assert search.best_params_ == {"max_steps": 60}  # more training: higher held-out likelihood
    assert search.best_estimator_.is_fitted


def test_repr_is_one_line():
    """The repr goes into model cards (a Markdown table cell) and JSON summaries: never broken over lines, as
    scikit-learn's pretty printer does for long ones."""
    flow = FlowCalibrator("paper", coupling="affine", permutation="lu", max_steps=30, lr=1e-4, batch_size=128, seed=3)
    chain = ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator(256, shrinkage=0.5), flow])
    text = repr(chain)
    assert "\n" not in text and text.startswith("ChainCalibrator(steps=[StandardNormCalibrator(), ")
    assert "batch_size=128" in text and "seed=3" in text
