"""Embedder: fit / encode / similarity, and save -> load with every way a folder can be wrong."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from bertflow import (
    Calibrator,
    CompatibilityError,
    Embedder,
    FlowCalibrator,
    IdentityCalibrator,
    InputError,
    ModelFileError,
    NotFittedError,
    SentenceEncoder,
    WhiteningCalibrator,
)
from bertflow.calibrators import AnchoredWhiteningCalibrator, StandardNormCalibrator, parse_calibrator
from bertflow.model_folder import CONFIG_FILE

from .conftest import SENTENCES

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]  # 64 distinct sentences
OTHER = ["the dog plays on the guitar", "a cat is the music", "the man", "the woman is playing"]


@pytest.fixture()
def fitted(tiny_encoder):
    return Embedder(tiny_encoder, FlowCalibrator(max_steps=20)).fit(CORPUS, regime="test")


def test_encode_and_similarity_shapes(fitted):
    z = fitted.encode(SENTENCES)
    assert z.shape == (len(SENTENCES), 32) and z.dtype == np.float32
    assert fitted.encode("The cat sleeps.").shape == (32,)
    # One return type each, as sentence-transformers: a float32 tensor [N1, N2] (two strings: [1, 1]) and [N].
    s = fitted.similarity("The cat sleeps.", "The cat sleeps.")
    assert isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.shape == (1, 1)
    assert float(s) == pytest.approx(1.0, abs=1e-5)
    m = fitted.similarity(SENTENCES[:3], SENTENCES)
    assert isinstance(m, torch.Tensor) and m.dtype == torch.float32 and m.shape == (3, len(SENTENCES))
    assert fitted.similarity("The cat sleeps.", SENTENCES).shape == (1, len(SENTENCES))
    np.testing.assert_allclose(np.diag(m[:, :3].numpy()), 1.0, atol=1e-5)
    pw = fitted.similarity_pairwise(SENTENCES[:3], SENTENCES[3:6])
    assert isinstance(pw, torch.Tensor) and pw.dtype == torch.float32 and pw.shape == (3,)
    np.testing.assert_allclose(pw.numpy(), [m[i, 3 + i] for i in range(3)], atol=1e-5)


def test_unfitted_embedder_refuses(tiny_encoder):
    with pytest.raises(NotFittedError):
        Embedder(tiny_encoder, FlowCalibrator()).encode("hello")
    # Identity needs no fitting: a raw-encoder pipeline works directly.
    assert Embedder(tiny_encoder, IdentityCalibrator()).encode("hello").shape == (32,)


def test_check_fitted_changes_nothing(tiny_encoder):
    """check_fitted() only checks: an identity calibrator is fitted when the Embedder is made, never by a check."""
    model = Embedder(tiny_encoder, IdentityCalibrator())
    assert model.calibrator.is_fitted and model.calibrator.n_features_in_ == 32
    model.calibrator = IdentityCalibrator()  # swapped in unfitted afterwards
    with pytest.raises(NotFittedError):
        model.check_fitted()
    assert not model.calibrator.is_fitted


def test_fit_records_corpus(fitted):
    info = fitted.fit_info
    assert info["n_sentences"] == len(CORPUS) and len(info["corpus_sha256"]) == 64 and info["regime"] == "test"


def test_save_load_identical(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    assert {p.name for p in path.iterdir()} == {CONFIG_FILE, "calibrator", "README.md"}
    loaded = Embedder.load(path, device="cpu")
    np.testing.assert_array_equal(loaded.encode(SENTENCES), fitted.encode(SENTENCES))
    assert loaded.fit_info == fitted.fit_info
    card = (path / "README.md").read_text()
    assert "corpus_sha256" in card and fitted.encoder.fingerprint() in card


def test_save_overwrites_atomically(fitted, tiny_encoder, tmp_path, monkeypatch):
    path = fitted.save(tmp_path / "model")
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    other = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("bertflow.model_folder.write_json", crash)
    with pytest.raises(OSError, match="disk full"):
        other.save(path, overwrite=True)
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before  # the old model is untouched
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_truncated_weights_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    weights = path / "calibrator" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelFileError, match="checksum"):
        Embedder.load(path)


def test_corrupted_weights_without_checksum_refused(fitted, tmp_path):
    """With the checksum list removed the folder is refused outright; a calibrator folder loaded on its own (no
    checksums there) still reports safetensors damage as a ModelFileError."""
    path = fitted.save(tmp_path / "model")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    cfg["files"] = {}
    (path / CONFIG_FILE).write_text(json.dumps(cfg))
    (path / "calibrator" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelFileError, match="no 'files' checksums"):
        Embedder.load(path)
    with pytest.raises(ModelFileError, match="truncated or corrupted"):
        Calibrator.load(path / "calibrator")


def test_edited_calibrator_config_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    cfg_file = path / "calibrator" / "config.json"
    cfg_file.write_text(cfg_file.read_text().replace('"n_steps": 20', '"n_steps": 21'))
    with pytest.raises(ModelFileError, match="checksum"):
        Embedder.load(path)


def test_edited_pooling_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    cfg["encoder"]["pooling"] = "cls"
    (path / CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(CompatibilityError, match="pooling"):
        Embedder.load(path)


def test_invalid_json_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    (path / CONFIG_FILE).write_text("{broken")
    with pytest.raises(ModelFileError, match="not valid JSON"):
        Embedder.load(path)


def test_newer_version_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    cfg["format_version"] = 99
    (path / CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match=rf"{CONFIG_FILE} is a model written by bertflow .* upgrade bertflow"):
        Embedder.load(path)
    cfg["format_version"] = "1"  # a hand edit: not an integer
    (path / CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="no valid format_version .* was it edited"):
        Embedder.load(path)


def test_missing_folder_or_file(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    (path / "calibrator" / "model.safetensors").unlink()
    with pytest.raises(ModelFileError, match="missing"):
        Embedder.load(path)


def test_a_calibrator_handed_in_alone_carries_no_encoder_record(fitted, other_tiny_model_dir, tmp_path):
    """The record of the encoder a calibrator was fitted on is the Embedder's (and its folder's), not the
    calibrator's: handed to an Embedder on its own, a fitted calibrator is checked by dimension only, and that
    Embedder saves no record it does not have (a folder whose encoder was swapped is refused on load:
    tests/calibrators/test_fitted_state.py)."""
    from bertflow.calibrators import Calibrator

    assert fitted.fitted_on["fingerprint"] == fitted.encoder.fingerprint()
    fitted.calibrator.save(tmp_path / "cal")
    assert "fitted_on" not in (tmp_path / "cal" / "config.json").read_text()
    other = SentenceEncoder(str(other_tiny_model_dir), device="cpu")  # same dimension, other weights
    handed = Embedder(other, Calibrator.load(tmp_path / "cal"))
    assert handed.fitted_on is None and handed.fit_info == {}
    folder = handed.save(tmp_path / "m")
    assert json.loads((folder / "bertflow_config.json").read_text())["calibrator"]["fitted_on"] is None


def test_calibrator_of_another_dimension_refused(tiny_encoder, tmp_path):
    cal = WhiteningCalibrator().fit(np.random.default_rng(0).normal(size=(100, 16)))
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        Embedder(tiny_encoder, cal)


@pytest.mark.slow
def test_end_to_end_default_model_on_stsb(default_encoder, data_dir, tmp_path):
    """The README's main job, on a slice: fit a flow on STS-B train sentences, save, load, score pairs."""
    from scipy.stats import spearmanr

    from bertflow.io.text import read_pairs

    train = read_pairs(data_dir / "STSBenchmark" / "train.tsv")
    corpus = list(dict.fromkeys(train.sentences1[:1500] + train.sentences2[:1500]))
    model = Embedder(default_encoder, FlowCalibrator()).fit(corpus, regime="STS-B train (slice)")
    model.save(tmp_path / "stsb-flow")
    loaded = Embedder.load(tmp_path / "stsb-flow", device="cpu")
    test = read_pairs(data_dir / "STSBenchmark" / "test.tsv")
    scores = loaded.similarity_pairwise(test.sentences1[:300], test.sentences2[:300])
    rho = spearmanr(scores, test.scores[:300]).statistic
    assert rho > 0.6  # all-MiniLM-L6-v2 is a strong STS model; a broken flow scrambles this
    np.testing.assert_array_equal(loaded.encode(test.sentences1[:20]), model.encode(test.sentences1[:20]))


# -- hub-ready folders ----------------------------------------------------------------------------------------


def test_include_encoder_makes_folder_self_contained(tiny_model_dir, tmp_path):
    import shutil

    source = shutil.copytree(tiny_model_dir, tmp_path / "encoder-src")
    model = Embedder(SentenceEncoder(str(source), device="cpu"), WhiteningCalibrator()).fit(CORPUS)
    expected = model.encode(SENTENCES)
    path = model.save(tmp_path / "model", include_encoder=True)
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= {
        p.name for p in (path / "encoder").iterdir()
    }
    assert "encoder/model.safetensors" in json.loads((path / CONFIG_FILE).read_text())["files"]
    shutil.rmtree(source)  # the original encoder is gone: loading must use the bundled copy
    loaded = Embedder.load(path, device="cpu")
    np.testing.assert_array_equal(loaded.encode(SENTENCES), expected)
    # Provenance: the original encoder, by its folder's name (a saved folder records no absolute path).
    assert loaded.encoder.get_config() == {**model.encoder.get_config(), "model": "encoder-src"}
    again = loaded.save(tmp_path / "model2", include_encoder=True)  # re-saving copies from the bundled folder
    np.testing.assert_array_equal(Embedder.load(again, device="cpu").encode(SENTENCES), expected)
    cfg = path / "encoder" / "config.json"
    cfg.write_text(cfg.read_text().replace("gelu", "relu"))
    with pytest.raises(ModelFileError, match="checksum"):
        Embedder.load(path)


def test_load_explains_missing_paths_and_offline_hub(fitted, tmp_path):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest: tests never reach the network
    hub_shaped = "no such folder 'someone/no-such-bertflow-model' here.*HF_HUB_OFFLINE"
    with pytest.raises(ModelFileError, match=hub_shaped) as e:
        Embedder.load("someone/no-such-bertflow-model")
    assert "\n" not in str(e.value)  # huggingface_hub's multi-line message is folded into the CLI's one line
    with pytest.raises(ModelFileError, match="no such folder") as e:
        Embedder.load(tmp_path / "not" / "there")
    assert "Hub" not in str(e.value)  # an absolute path is never a repo id: no network error for a typo
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelFileError, match="is a file"):
        Embedder.load(tmp_path / "file")


def test_similarity_of_embeddings_as_sentence_transformers(fitted):
    """Two embedding matrices (arrays or tensors) in: their cosine as a float32 tensor, as
    SentenceTransformer.similarity; sentences in: the same type and the same numbers."""
    z = fitted.encode(SENTENCES)
    expected = fitted.similarity(SENTENCES[:3], SENTENCES)
    sims = fitted.similarity(z[:3], torch.from_numpy(z))
    assert isinstance(sims, torch.Tensor) and sims.dtype == torch.float32 and sims.shape == (3, len(SENTENCES))
    np.testing.assert_allclose(sims.numpy(), expected.numpy(), atol=1e-6)
    pairs = fitted.similarity_pairwise(z[:3], z[3:6])
    assert isinstance(pairs, torch.Tensor) and pairs.shape == (3,)
    np.testing.assert_allclose(
        pairs.numpy(), fitted.similarity_pairwise(SENTENCES[:3], SENTENCES[3:6]).numpy(), atol=1e-6
    )
    with pytest.raises(InputError, match="one shape"):
        fitted.similarity_pairwise(z[:3], z[:4])


@pytest.fixture()
def encoder(tiny_model_dir) -> SentenceEncoder:
    return SentenceEncoder(str(tiny_model_dir), pooling="sif:first-last-avg", device="cpu")


def test_fit_counts_the_fitting_sentences_and_the_folder_keeps_them(encoder, tmp_path):
    model = Embedder(encoder, WhiteningCalibrator(n_components=4)).fit(SENTENCES * 3)
    assert encoder.token_statistics == encoder.count_tokens(SENTENCES * 3)
    assert model.fitted_on["token_statistics"] == encoder.token_statistics.digest()
    before = model.encode(OTHER)
    model.save(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "bertflow_config.json").read_text())
    assert config["encoder"]["pooling"] == "sif:first-last-avg"
    assert "token_statistics/token_statistics.safetensors" in config["files"]  # checksummed like the rest
    back = Embedder.load(tmp_path / "m", device="cpu")
    assert back.encoder.token_statistics == encoder.token_statistics
    assert np.array_equal(back.encode(OTHER), before)
    torch.testing.assert_close(
        back.similarity(OTHER[0], OTHER[1]), model.similarity(OTHER[0], OTHER[1]), atol=1e-6, rtol=0
    )

    with open(tmp_path / "m" / "token_statistics" / "token_statistics.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(ModelFileError, match="checksum"):
        Embedder.load(tmp_path / "m")


def test_token_corpus_or_both(encoder):
    corpus_only = Embedder(encoder, WhiteningCalibrator(n_components=4)).fit(SENTENCES * 3, token_corpus=OTHER)
    assert encoder.token_statistics == encoder.count_tokens(OTHER)
    both = Embedder(encoder, WhiteningCalibrator(n_components=4))
    both.fit(SENTENCES * 3, token_corpus=OTHER, token_source="both")
    assert encoder.token_statistics == encoder.count_tokens(SENTENCES * 3 + OTHER)
    assert corpus_only.fitted_on["token_statistics"] != both.fitted_on["token_statistics"]
    # The first model's calibrator (with its encoder record) met the second's statistics: refused, not applied to
    # other weights.
    with pytest.raises(CompatibilityError, match="token_statistics"):
        Embedder(encoder, corpus_only.calibrator, fitted_on=corpus_only.fitted_on)


@pytest.mark.parametrize(
    ("pooling", "kwargs", "match"),
    [
        ("first-last-avg", {"token_corpus": OTHER}, "not one"),
        ("sif:mean", {"token_source": "corpus"}, "needs a token corpus"),
        ("sif:mean", {"token_source": "fit", "token_corpus": OTHER}, "'corpus' or 'both'"),
        ("sif:mean", {"token_source": "all"}, "token_source must be"),
    ],
)
def test_token_options_are_checked_before_work(tiny_model_dir, pooling, kwargs, match):
    enc = SentenceEncoder(str(tiny_model_dir), pooling=pooling, device="cpu")
    with pytest.raises(InputError, match=match):
        Embedder(enc, WhiteningCalibrator()).fit(SENTENCES, **kwargs)


@pytest.mark.parametrize(
    ("calibrator", "width"),
    [(WhiteningCalibrator(5), 5), (AnchoredWhiteningCalibrator(), None), (IdentityCalibrator(), None)],
)
def test_encoding_no_sentences_has_the_calibrated_width(tiny_encoder, calibrator, width):
    model = Embedder(tiny_encoder, calibrator).fit(CORPUS)
    expected = model.calibrator_dim()
    assert width is None or expected == width
    assert model.encode([]).shape == (0, expected) == (0, model.encode(SENTENCES[:2]).shape[1])


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


@pytest.mark.parametrize(
    "spec", ["whitening", "whitening-4", "standard-norm", "natsv-1", "anchored", "anchored-100", "sn+whitening"]
)
def test_fitting_on_identical_sentences_is_refused(tiny_encoder, spec):
    """The same sentence 50 times has no variance: whitening used to save a 0-dimensional model (every similarity
    0), standard-norm scored unrelated pairs 0.32. Now a clear error before anything is saved."""
    with pytest.raises(InputError, match="50 fitting embeddings are all equal"):
        Embedder(tiny_encoder, parse_calibrator(spec)).fit(["A man is playing a guitar."] * 50)


def test_same_seed_same_files_and_embeddings(tiny_encoder, tmp_path):
    corpus = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]
    paths = []
    for name in ("a", "b"):
        paths.append(Embedder(tiny_encoder, FlowCalibrator(max_steps=25, seed=7)).fit(corpus).save(tmp_path / name))
    weights = [(p / "calibrator" / "model.safetensors").read_bytes() for p in paths]
    assert weights[0] == weights[1]
    a, b = (Embedder.load(p).encode(SENTENCES) for p in paths)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(tiny_encoder.encode(SENTENCES), tiny_encoder.encode(SENTENCES))


def test_a_plain_fitted_calibrator_warns_and_a_width_mismatch_is_refused(tiny_encoder):
    import warnings

    from bertflow.calibrators import IdentityCalibrator, WhiteningCalibrator
    from bertflow.errors import CompatibilityError

    X = np.random.default_rng(0).normal(size=(200, tiny_encoder.dim)).astype(np.float32)
    with pytest.warns(UserWarning, match="records no encoder"):
        Embedder(tiny_encoder, WhiteningCalibrator().fit(X))
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        Embedder(tiny_encoder, WhiteningCalibrator().fit(X[:, :16]))
    # Fitted after the Embedder was made: the width is checked before encoding, not a shape error inside torch.
    late = WhiteningCalibrator()
    model = Embedder(tiny_encoder, late)
    late.fit(X[:, :16])
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        model.encode(["A man is playing a guitar."])
    # Fitted through an Embedder, the encoder is recorded there (fitted_on): no warning when the record is handed on
    # with the calibrator; nor for the identity (nothing fitted).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
        Embedder(tiny_encoder, fitted.calibrator, fitted_on=fitted.fitted_on)
        Embedder(tiny_encoder, IdentityCalibrator().fit(X))


def test_bad_inputs_that_were_tracebacks_are_input_errors(tiny_encoder):
    from bertflow import SentenceEncoder
    from bertflow.calibrators import WhiteningCalibrator
    from bertflow.errors import InputError

    model = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    with pytest.raises(InputError, match="lone surrogate"):
        model.encode(["fine", "broken \ud800 text"])
    with pytest.raises(InputError, match="unknown device"):
        SentenceEncoder("unused", device="bogus")
    with pytest.raises(InputError, match="overflow"):
        WhiteningCalibrator().fit(np.random.default_rng(0).normal(size=(50, 8)) * 1e200)
    with pytest.raises(InputError, match="one width"):
        model.similarity(np.ones((2, tiny_encoder.dim), np.float32), np.ones((3, 16), np.float32))
    with pytest.raises(InputError, match="at least 2 sentences"):
        model.encode("one sentence", precision="int8")
    assert model.encode(CORPUS[:3], precision="int8").dtype == np.int8
