"""AutoCalibrator: the rule's three statistics (rawness, strength, reliability), its output, and how Embedder.fit
drives it (token anisotropy from the same forward pass, SIF weighting with a generic prior on a raw encoder)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from bertflow import Embedder, InputError, SentenceEncoder
from bertflow.calibrators import AnchoredWhiteningCalibrator, AutoCalibrator, Calibrator, parse_calibrator
from bertflow.calibrators.anchored import anisotropy
from bertflow.calibrators.auto import no_harm_warning, reliability
from bertflow.encoding import token_prior
from bertflow.encoding.token_prior import TokenPrior


def cos_matrix(Z: np.ndarray) -> np.ndarray:
    Z = np.asarray(Z, dtype=np.float64)
    Z = Z / np.linalg.norm(Z, axis=1, keepdims=True)
    return Z @ Z.T


def scaled(variances: np.ndarray, n: int = 2000, shift: float = 3.0, seed: int = 0) -> np.ndarray:
    """Gaussian rows with the given per-direction variances, randomly rotated and shifted off the origin."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(len(variances), len(variances))))
    return (rng.normal(size=(n, len(variances))) * np.sqrt(variances)) @ q.T + shift


@pytest.mark.parametrize("probe, rawness", [(0.05, 0.0), (0.40, 0.0), (0.45, 0.5), (0.50, 1.0), (0.9, 1.0)])
def test_rawness_reads_the_token_anisotropy(probe, rawness):
    X = scaled(np.geomspace(1, 10, 40))
    auto = AutoCalibrator().fit(X, token_anisotropy=probe)
    assert auto.rawness_source_ == "token anisotropy" and auto.token_anisotropy_ == probe
    assert auto.rawness_ == pytest.approx(rawness)
    assert auto.alpha_ == pytest.approx(0.5 + 0.25 * rawness)


def test_without_a_probe_the_embeddings_own_anisotropy_is_read():
    X = scaled(np.geomspace(1, 10, 40), shift=10.0)  # far from the origin: anisotropic
    auto = AutoCalibrator().fit(X)
    assert auto.rawness_source_ == "embedding anisotropy"
    assert auto.token_anisotropy_ == pytest.approx(anisotropy(X)) and auto.rawness_ == 1.0


def test_output_is_anchored_whitening_with_the_rules_alpha_and_weight():
    X = scaled(np.geomspace(1, 10, 40))
    auto = AutoCalibrator().fit(X, token_anisotropy=0.6)
    # Enough sentences: the weight of the calibrated cosine is the anisotropy, as in anchored whitening.
    assert auto.reliability_ == 1.0 and auto.weight_ == pytest.approx(anisotropy(X))
    same = AnchoredWhiteningCalibrator(alpha=0.75, weight=auto.weight_).fit(X)
    np.testing.assert_allclose(auto.transform(X[:50]), same.transform(X[:50]), atol=1e-6)
    # Its cosine is the convex mix of the raw cosine and the partially whitened one.
    Z = auto.transform(X[:30])
    raw, cal = cos_matrix(X[:30]), cos_matrix((X[:30] - auto.mean_) @ auto.components_)
    np.testing.assert_allclose(cos_matrix(Z), (1 - auto.weight_) * raw + auto.weight_ * cal, atol=1e-5)


def test_fewer_sentences_than_dimensions_keep_more_of_the_raw_cosine():
    d = 40
    few = scaled(np.geomspace(1, 10, d), n=20, seed=3)
    auto = AutoCalibrator().fit(few)
    assert auto.reliability_ == pytest.approx(20 / d) == reliability(20, d)
    assert auto.weight_ == pytest.approx(anisotropy(few) * 20 / d)
    # The no-harm diagnostic says what auto did; whitening on as few gets the warning that it is likely worse.
    assert "keeps" in no_harm_warning(auto, 20, d)
    assert "likely worse" in no_harm_warning(parse_calibrator("whitening").fit(scaled(np.ones(d), n=60)), 60, d)
    assert no_harm_warning(parse_calibrator("whitening").fit(scaled(np.ones(d), n=100)), 100, d) is None
    assert no_harm_warning(AutoCalibrator().fit(scaled(np.ones(d), n=100)), 100, d) is None


def test_round_trip_keeps_the_choice(tmp_path):
    X = scaled(np.r_[np.full(3, 100.0), np.full(37, 0.3)], shift=10.0)
    auto = parse_calibrator("auto").fit(X, token_anisotropy=0.61)
    auto.save(tmp_path / "cal")
    back = Calibrator.load(tmp_path / "cal")
    assert isinstance(back, AutoCalibrator)
    for name in ("token_anisotropy_", "rawness_source_", "rawness_", "reliability_", "alpha_", "weight_"):
        assert getattr(back, name) == getattr(auto, name), name
    np.testing.assert_array_equal(back.transform(X[:20]), auto.transform(X[:20]))
    assert back.describe() == auto.describe()


@pytest.mark.parametrize("low, high", [(0.5, 0.4), (-0.1, 0.5), (0.4, 1.5), (float("nan"), 0.5)])
def test_bad_thresholds_are_refused(low, high):
    with pytest.raises(InputError, match="low|high"):
        AutoCalibrator(low=low, high=high).fit(scaled(np.ones(5), n=50))


def test_bad_probe_is_refused():
    with pytest.raises(InputError, match="token_anisotropy"):
        AutoCalibrator().fit(scaled(np.ones(5), n=50), token_anisotropy=1.5)


def _tiny_prior(encoder: SentenceEncoder, corpus: list[str], tmp_path) -> TokenPrior:
    folder = tmp_path / "prior"
    encoder.count_tokens(corpus).save(folder)
    digest = token_prior.vocab_digest(encoder.tokenizer)
    (folder / token_prior.PRIOR_CONFIG).write_text(f'{{"vocab_digest": "{digest}", "source": "test corpus"}}')
    return TokenPrior(folder)


SENTENCES = [f"sentence number {i} talks about {w} and {v}" for i, (w, v) in enumerate(
    [("cats", "dogs"), ("rain", "sun"), ("music", "art"), ("trains", "boats"), ("bread", "wine")] * 12
)]  # fmt: skip


@pytest.mark.parametrize("raw_encoder", [True, False])
def test_embedder_fit_weights_a_raw_encoder_with_the_prior_in_one_pass(tiny_model_dir, tmp_path, monkeypatch,
                                                                       raw_encoder, caplog):  # fmt: skip
    encoder = SentenceEncoder(str(tiny_model_dir), pooling="first-last-avg", device="cpu")
    prior = _tiny_prior(encoder, ["a generic corpus of words", "other words entirely"], tmp_path)
    monkeypatch.setattr("bertflow.autofit.prior_for", lambda tokenizer: prior)
    # Which kind of encoder the tiny model looks like is set by the thresholds, around its own token anisotropy.
    probe = anisotropy(encoder.encode(SENTENCES, poolings=["mean"])["mean"])
    auto = (
        AutoCalibrator(low=probe - 0.02, high=probe - 0.01)
        if raw_encoder
        else AutoCalibrator(low=probe + (1 - probe) / 3, high=probe + 2 * (1 - probe) / 3)
    )
    passes = []
    original = SentenceEncoder.encode
    monkeypatch.setattr(
        SentenceEncoder, "encode", lambda self, *a, **k: passes.append(k.get("poolings")) or original(self, *a, **k)
    )
    with caplog.at_level(logging.INFO, logger="bertflow"):
        model = Embedder(encoder, auto).fit(SENTENCES)
    assert len(passes) == 1 and len(passes[0]) == 3  # own pooling, the token mean, the weighted pooling: one pass
    assert auto.token_anisotropy_ == pytest.approx(probe, abs=1e-6)
    info = model.fit_info["auto"]
    if raw_encoder:
        assert encoder.pooling.name == "sif:first-last-avg" and info["weighting"] == "sif"
        assert encoder.token_statistics == prior.statistics and "test corpus" in info["token_statistics"]
    else:
        assert encoder.pooling.name == "first-last-avg" and info["weighting"] == "none"
        assert encoder.token_statistics is None
    # What was fitted on is what encode gives from now on, and a saved folder gives it back identically.
    np.testing.assert_allclose(model.encode(SENTENCES[:5]), auto.transform(encoder.encode(SENTENCES[:5])), atol=1e-6)
    model.save(tmp_path / "m")
    back = Embedder.load(tmp_path / "m")
    assert back.encoder.pooling.name == encoder.pooling.name
    np.testing.assert_allclose(back.encode(SENTENCES[:5]), model.encode(SENTENCES[:5]), atol=1e-6)
    assert "auto: token weighting chosen" in (tmp_path / "m" / "README.md").read_text()


def test_whitening_type_is_declared_by_the_registered_class():
    """no_harm_warning reads ``rescales_variance`` from the class the registry holds, not a list of names."""
    from bertflow.calibrators.registry import calibrator_classes

    d, X = 40, scaled(np.ones(40), n=60)
    declared = {name for name, cls in calibrator_classes().items() if vars(cls).get("rescales_variance")}
    assert {"whitening", "flow", "anchored", "standard-norm", "chain"} <= declared
    assert not {"identity", "all-but-the-top"} & declared
    assert no_harm_warning(parse_calibrator("natsv-2").fit(X), 60, d) is None
    # A registered class that declares nothing gets no warning, whatever its name starts with.
    whitening = parse_calibrator("whitening").fit(X)
    try:
        type(whitening).rescales_variance = False
        assert no_harm_warning(whitening, 60, d) is None
    finally:
        type(whitening).rescales_variance = True
    assert "likely worse" in no_harm_warning(whitening, 60, d)
