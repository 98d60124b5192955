"""Silent wrong results (issue 13): each case of docs/robustness-silent.md fails loudly or does the right thing.

Every test here fails on the code before the fix: a degenerate fit that used to save a useless model, a corrupted
value that used to flow into similarities, an input that used to be read as something else.
"""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import (
    Embedder,
    FlowCalibrator,
    InputError,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.calibrators import (
    AllButTheTopCalibrator,
    AnchoredWhiteningCalibrator,
    ChainCalibrator,
    IdentityCalibrator,
    parse_calibrator,
)
from bertflow.search import EmbeddingIndex

from .conftest import SENTENCES

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]  # 64 distinct sentences


def _data(n: int = 200, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)


# -- 7: shapes, NaN in inverse_transform, NaN hyperparameters -----------------------------------------------


@pytest.mark.parametrize(
    ("calibrator", "width"),
    [(WhiteningCalibrator(5), 5), (AnchoredWhiteningCalibrator(), None), (IdentityCalibrator(), None)],
)
def test_encoding_no_sentences_has_the_calibrated_width(tiny_encoder, calibrator, width):
    model = Embedder(tiny_encoder, calibrator).fit(CORPUS)
    expected = model.calibrator_dim()
    assert width is None or expected == width
    assert model.encode([]).shape == (0, expected) == (0, model.encode(SENTENCES[:2]).shape[1])


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


def test_nan_shrinkage_is_refused_by_the_moments_fit_too():
    x = _data(100, 8)
    with pytest.raises(InputError, match="shrinkage must be a finite number"):
        WhiteningCalibrator(shrinkage=float("nan")).fit_from_moments(len(x), x.sum(0), x.T @ x)


# -- 5: calibrated output checked for NaN, Inf and implausible magnitudes ------------------------------------


def test_a_corrupted_calibrator_weight_is_caught_not_scored(tiny_encoder):
    """One bad weight makes every vector point along one axis (every similarity 1.000000): refused instead,
    on the encoder's device path (Embedder.encode / iter_encode) and in Calibrator.transform."""
    model = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
    cal = model.calibrator
    healthy, pooled = model.encode(SENTENCES), tiny_encoder.encode(SENTENCES)
    assert np.abs(healthy).max() < 1e3
    original = cal.components_[3, 1]
    # 1e35; what flipping the 6th exponent bit of a float does (x 2^32); NaN.
    for corrupted in (1e35, original * 2.0**32, np.nan):
        cal.components_[3, 1] = corrupted
        with pytest.raises(InputError, match=r"transform \(calibrator\) turned finite embeddings from .* column 1"):
            model.encode(SENTENCES)
        with pytest.raises(InputError, match="turned finite embeddings"):
            list(model.iter_encode(SENTENCES))
        with pytest.raises(InputError, match="WhiteningCalibrator turned finite embeddings into .* column 1"):
            cal.transform(pooled)
    cal.components_[3, 1] = original
    np.testing.assert_array_equal(model.encode(SENTENCES), healthy)


def test_large_but_plausible_outputs_pass(tiny_encoder):
    """Held-out rows far from the fitting data (10x their spread) still calibrate: the bound is not a tripwire."""
    x = _data(300, 16)
    cal = WhiteningCalibrator().fit(x)
    far = cal.mean_ + 10 * (x[:5] - cal.mean_)
    assert np.isfinite(cal.transform(far)).all()
    assert np.isfinite(Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS[:8]).encode(CORPUS)).all()


# -- 3: degenerate fits --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["whitening", "whitening-4", "standard-norm", "natsv-1", "anchored", "anchored-100", "sn+whitening"]
)
def test_fitting_on_identical_sentences_is_refused(tiny_encoder, spec):
    """The same sentence 50 times has no variance: whitening used to save a 0-dimensional model (every similarity
    0), standard-norm scored unrelated pairs 0.32. Now a clear error before anything is saved."""
    with pytest.raises(InputError, match="50 fitting embeddings are all equal"):
        Embedder(tiny_encoder, parse_calibrator(spec)).fit(["A man is playing a guitar."] * 50)


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


# -- 4: model folders that would load unchecked or from elsewhere ---------------------------------------------


def _edit_config(folder, edit) -> None:
    import json

    path = folder / "bertflow_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


@pytest.fixture()
def saved(tiny_encoder, tmp_path):
    return Embedder(tiny_encoder, WhiteningCalibrator(4)).fit(CORPUS).save(tmp_path / "model")


@pytest.mark.parametrize("how", ["deleted", "emptied", "garbled"])
def test_a_config_without_its_checksums_is_refused(saved, how):
    from bertflow import ModelFileError

    def strip(config):
        if how == "deleted":
            del config["files"]
        else:
            config["files"] = {} if how == "emptied" else ["calibrator/model.safetensors"]

    _edit_config(saved, strip)
    with pytest.raises(ModelFileError, match="no 'files' checksums"):
        Embedder.load(saved)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("calibrator", "../other/calibrator"),
        ("calibrator", "/OTHER/calibrator"),
        ("calibrator", "calibrator/../../other/calibrator"),
        ("encoder", "../other/encoder"),
        ("files", "../other/calibrator/model.safetensors"),
    ],
)
def test_paths_in_the_config_may_not_leave_the_folder(tiny_encoder, saved, tmp_path, key, value):
    """Another (valid, differently fitted) model next door: its calibrator must not be loaded through this config."""
    from bertflow import ModelFileError

    other = Embedder(tiny_encoder, WhiteningCalibrator(3)).fit(CORPUS[:40])
    other = other.save(tmp_path / "other", include_encoder=True)
    value = value.replace("/OTHER", str(other))

    def point_outside(config):
        if key == "files":
            config["files"][value] = config["files"].pop("calibrator/model.safetensors")
        else:
            config[key]["path"] = value

    _edit_config(saved, point_outside)
    with pytest.raises(ModelFileError, match="not a path inside the folder"):
        Embedder.load(saved)


def test_a_file_without_a_checksum_is_refused(saved):
    """A file slipped into a folder the loader reads (or one whose entry was removed from the list) is refused."""
    from bertflow import ModelFileError

    _edit_config(saved, lambda config: config["files"].pop("calibrator/config.json"))
    with pytest.raises(ModelFileError, match="config.json has no checksum"):
        Embedder.load(saved)


# -- 8: saved folders are readable by others (the umask decides, not mkdtemp's 0700) ------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_model_and_index_follow_the_umask(tiny_encoder, tmp_path, umask):
    import os
    import stat

    from bertflow.io.files import atomic_write_text, current_umask

    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        model = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
        folders = [model.save(tmp_path / "model", include_encoder=True)]
        folders.append(EmbeddingIndex.from_sentences(model, SENTENCES).save(tmp_path / "index"))
        atomic_write_text(tmp_path / "note.txt", "hello")
    finally:
        os.umask(previous)
    paths = [p for folder in folders for p in [folder, *folder.rglob("*")]] + [tmp_path / "note.txt"]
    assert len(paths) > 8
    for path in paths:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
