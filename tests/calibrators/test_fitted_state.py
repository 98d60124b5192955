"""One owner for fitted state: only a calibrator's own fit assigns it, every fit resets all of it, and the record
of the encoder a calibrator was fitted on lives with the Embedder (its saved folder), not in the calibrator."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from bertflow import Embedder, FlowCalibrator, SentenceEncoder, StandardNormCalibrator, WhiteningCalibrator
from bertflow.errors import CompatibilityError

from ..conftest import SENTENCES, make_tiny_bert

CORPUS = [f"{s} ({i})" for i, s in enumerate(SENTENCES * 6)]


def _fitted_attributes(calibrator: object) -> dict[str, object]:
    return {k: v for k, v in vars(calibrator).items() if k.endswith("_") and not k.startswith("__")}


def test_a_plain_refit_keeps_no_provenance_of_the_embedder_fit(tiny_model_dir, tmp_path):
    """The issue's reproduction: fit through an Embedder on encoder A, refit the same calibrator with plain
    ``fit(X_B)`` on encoder B's embeddings (another width). The calibrator must not keep A's record: B accepts it,
    and a model saved with B carries no claim about A."""
    encoder_a = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu")
    encoder_b = SentenceEncoder(str(make_tiny_bert(tmp_path / "b", seed=2, hidden=16)), pooling="mean", device="cpu")
    cal = StandardNormCalibrator()
    embedder_a = Embedder(encoder_a, cal).fit(CORPUS)
    cal.fit(encoder_b.encode(CORPUS))
    assert cal.n_features_in_ == 16

    embedder_b = Embedder(encoder_b, cal)  # refused while A's record survived the refit
    folder = embedder_b.save(tmp_path / "model-b")
    saved = json.loads((folder / "bertflow_config.json").read_text())
    assert encoder_a.fingerprint() not in json.dumps(saved) + (folder / "calibrator" / "config.json").read_text()
    reloaded = Embedder.load(folder)
    np.testing.assert_allclose(reloaded.encode(SENTENCES), embedder_b.encode(SENTENCES), rtol=1e-5, atol=1e-6)
    # The Embedder fitted on A no longer holds a calibrator for A's embeddings: it refuses to save that pairing.
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        embedder_a.save(tmp_path / "model-a")


def test_the_embedder_record_is_checked_on_load(tiny_model_dir, other_tiny_model_dir, tmp_path):
    """A folder whose encoder was swapped for another checkpoint of the same width is refused: the record of what
    the calibrator was fitted on is saved with the Embedder's folder."""
    encoder = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu")
    folder = Embedder(encoder, WhiteningCalibrator(8)).fit(CORPUS).save(tmp_path / "m")
    config_file = folder / "bertflow_config.json"
    config = json.loads(config_file.read_text())
    assert config["calibrator"]["fitted_on"]["fingerprint"] == encoder.fingerprint()
    other = SentenceEncoder(str(other_tiny_model_dir), pooling="mean", device="cpu")
    # The folder records a local encoder by name and by its path relative to the model folder: point both elsewhere.
    rel = os.path.relpath(other_tiny_model_dir, folder)
    config["encoder"] = {**config["encoder"], "model": other_tiny_model_dir.name, "local_path": rel}
    config_file.write_text(json.dumps(config))
    with pytest.raises(CompatibilityError, match="fingerprint"):
        Embedder.load(folder)
    assert other.fingerprint() != encoder.fingerprint()


@pytest.mark.parametrize(
    "make",
    [
        lambda: WhiteningCalibrator(4),
        lambda: StandardNormCalibrator(),
        lambda: FlowCalibrator(max_steps=5, validation_fraction=0.2, eval_every=2),
    ],
    ids=["whitening", "standard-norm", "flow"],
)
def test_every_fit_resets_all_fitted_state(make, anisotropic_data):
    """A refit on an array after a fit on a DataFrame leaves exactly the attributes a fresh fit sets."""
    X = anisotropic_data
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(X.shape[1])])
    refit = make().fit(frame)
    assert hasattr(refit, "feature_names_in_")
    refit.fit(X)
    assert sorted(_fitted_attributes(refit)) == sorted(_fitted_attributes(make().fit(X)))


def test_fit_from_moments_resets_all_fitted_state(anisotropic_data):
    X = anisotropic_data
    cal = WhiteningCalibrator(4).fit(pd.DataFrame(X, columns=[f"c{i}" for i in range(X.shape[1])]))
    cal.fit_from_moments(len(X), X.sum(axis=0), X.T @ X)
    assert sorted(_fitted_attributes(cal)) == sorted(_fitted_attributes(WhiteningCalibrator(4).fit(X)))
    np.testing.assert_allclose(cal.transform(X), WhiteningCalibrator(4).fit(X).transform(X), rtol=1e-4, atol=1e-5)


def test_a_diverged_flow_fit_is_not_fitted_and_a_refit_starts_clean(anisotropic_data):
    """Divergence leaves the diagnostics (the kept parameters, history) but no fitted marker; a good refit then
    has exactly a fresh fit's attributes."""
    from bertflow import DivergenceError

    cal = FlowCalibrator(lr=1e6, max_steps=200, coupling="affine")
    with pytest.raises(DivergenceError):
        cal.fit(anisotropic_data * 1e3)
    assert not cal.is_fitted and cal.history_["step"]
    cal.set_params(lr=1e-3, max_steps=5, coupling=None)
    cal.fit(anisotropic_data)
    fresh = FlowCalibrator(max_steps=5).fit(anisotropic_data)
    assert sorted(_fitted_attributes(cal)) == sorted(_fitted_attributes(fresh))
    np.testing.assert_array_equal(cal.transform(anisotropic_data), fresh.transform(anisotropic_data))
