"""Embedder: fit / encode / similarity, and save -> load with every way a folder can be wrong."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

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
from bertflow.card import encoder_license, model_card
from bertflow.hub import push
from bertflow.model_folder import CONFIG_FILE

from .conftest import SENTENCES

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]  # 64 distinct sentences


@pytest.fixture()
def fitted(tiny_encoder):
    return Embedder(tiny_encoder, FlowCalibrator(max_steps=20)).fit(CORPUS, regime="test")


def test_encode_and_similarity_shapes(fitted):
    z = fitted.encode(SENTENCES)
    assert z.shape == (len(SENTENCES), 32) and z.dtype == np.float32
    assert fitted.encode("The cat sleeps.").shape == (32,)
    s = fitted.similarity("The cat sleeps.", "The cat sleeps.")
    assert isinstance(s, float) and s == pytest.approx(1.0, abs=1e-5)
    m = fitted.similarity(SENTENCES[:3], SENTENCES)
    assert m.shape == (3, len(SENTENCES))
    np.testing.assert_allclose(np.diag(m[:, :3]), 1.0, atol=1e-5)
    pw = fitted.similarity_pairwise(SENTENCES[:3], SENTENCES[3:6])
    np.testing.assert_allclose(pw, [m[i, 3 + i] for i in range(3)], atol=1e-5)


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


def front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_model_card_is_hub_ready(fitted, tmp_path, monkeypatch):
    from bertflow import __version__
    from bertflow.calibrators.base import calibrator_fingerprint

    path = fitted.save(tmp_path / "model")
    card = (path / "README.md").read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "bertflow" and meta["pipeline_tag"] == "sentence-similarity"
    assert "calibrator-flow" in meta["tags"] and "bert-flow" in meta["tags"]
    assert "base_model" not in meta  # a local encoder path is no hub id
    info = fitted.fit_info
    for fact in (
        f"| corpus size (sentences) | {info['n_sentences']} |",
        f"| corpus_sha256 | `{info['corpus_sha256']}` |",
        "| regime (fitting corpus) | test |",
        "| pooling | `mean` |",
        f"| bertflow version | {__version__} |",
        f"`{calibrator_fingerprint(fitted.calibrator)}`",
    ):
        assert fact in card
    # A hub encoder: its id and the commit its files came from (a local folder's provenance is its files' sha256).
    monkeypatch.setattr(fitted.encoder, "model_id", "sentence-transformers/all-MiniLM-L6-v2")
    monkeypatch.setattr(fitted.encoder, "_provenance", {"commit": "0" * 40})
    assert front_matter(model_card(fitted))["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"


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


def test_source_is_recorded(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    assert fitted.source == str(path.resolve())
    assert Embedder.load(path, device="cpu").source == str(path.resolve())


def test_card_licence_and_local_encoder_provenance(tiny_model_dir, tmp_path):
    """Apache-2.0 for the calibrator; the encoder's licence read from its README; its weight files' sha256."""
    import hashlib
    import shutil

    from bertflow.model_folder import CONFIG_FILE

    source = shutil.copytree(tiny_model_dir, tmp_path / "encoder-src")
    (source / "README.md").write_text("---\nlanguage: en\nlicense: mit\n---\n# tiny\n", encoding="utf-8")
    model = Embedder(SentenceEncoder(str(source), device="cpu"), WhiteningCalibrator()).fit(CORPUS)
    assert encoder_license(model) == "mit"
    path = model.save(tmp_path / "model")
    card = (path / "README.md").read_text()
    assert front_matter(card)["license"] == "apache-2.0" and "## Licence" in card and "(`mit`, as its files" in card
    digest = hashlib.sha256((source / "model.safetensors").read_bytes()).hexdigest()
    enc = json.loads((path / CONFIG_FILE).read_text())["encoder"]
    assert enc["weights_sha256"] == {"model.safetensors": digest} and enc["revision"] is None
    assert f"`{digest}`" in card
    # Bundled, the folder holds MIT files too: the card may not claim Apache-2.0 for all of it.
    bundled = model.save(tmp_path / "bundled", include_encoder=True)
    assert front_matter((bundled / "README.md").read_text())["license"] == "other"
    loaded = Embedder.load(bundled, device="cpu")  # provenance of the original folder, not of the copy's path
    assert loaded.encoder.provenance() == {"weights_sha256": {"model.safetensors": digest}}
    assert encoder_license(loaded) == "mit"
    (source / "README.md").unlink()
    assert encoder_license(model) is None and "not declared in its files" in model_card(model)


def test_hub_encoder_is_pinned_to_its_commit(tiny_model_dir, other_tiny_model_dir, tmp_path, monkeypatch):
    """An encoder from the hub cache is saved with the commit it was loaded from, and loading uses that commit
    even after the repo's main branch moves to other weights (offline, a hand-made huggingface_hub cache)."""
    import shutil

    from huggingface_hub import constants

    repo = tmp_path / "cache" / "models--bertflow-test--tiny"
    first, second = "a" * 40, "b" * 40
    shutil.copytree(tiny_model_dir, repo / "snapshots" / first)
    shutil.copytree(other_tiny_model_dir, repo / "snapshots" / second)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(first)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model = Embedder(SentenceEncoder("bertflow-test/tiny", device="cpu"), WhiteningCalibrator()).fit(CORPUS)
    assert model.encoder.provenance() == {"commit": first}
    path = model.save(tmp_path / "model")
    saved = json.loads((path / CONFIG_FILE).read_text())["encoder"]
    assert saved["revision"] == first and saved["commit"] == first and "weights_sha256" not in saved
    (repo / "refs" / "main").write_text(second)  # main moves on to other weights
    assert SentenceEncoder("bertflow-test/tiny", device="cpu").fingerprint() != model.encoder.fingerprint()
    loaded = Embedder.load(path, device="cpu")  # a moved encoder would be refused (fingerprint); pinned, it loads
    assert loaded.encoder.revision == first
    np.testing.assert_array_equal(loaded.encode(SENTENCES), model.encode(SENTENCES))


def test_push_to_hub_uploads_the_saved_folder(tiny_encoder, tmp_path, monkeypatch):
    """create_repo + create_branch + upload_folder of a folder Embedder.load accepts; nothing leaves the machine
    (HfApi's methods are replaced by recorders) and an unfitted model is refused before any call."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    calls: list[tuple[str, dict]] = []

    def upload_folder(self, **kw):
        import shutil

        kept = tmp_path / "uploaded"
        shutil.copytree(kw["folder_path"], kept)  # the temporary folder is gone after the call
        calls.append(("upload_folder", {**kw, "folder_path": kept}))
        return SimpleNamespace(commit_url="https://huggingface.co/me/flow/commit/123")

    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create_repo", {**kw, "repo_id": repo_id}))
    )
    monkeypatch.setattr(HfApi, "create_branch", lambda self, repo_id, **kw: calls.append(("create_branch", kw)))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    with pytest.raises(NotFittedError):
        push(Embedder(tiny_encoder, WhiteningCalibrator()), "me/flow")
    assert calls == []
    model = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
    with pytest.raises(InputError, match="repo_id"):
        push(model, "../flow")
    # A local encoder folder names nothing on the Hub: it is pushed only bundled.
    with pytest.raises(InputError, match="include_encoder=True"):
        push(model, "me/flow")
    assert calls == []
    url = push(
        model, "me/flow", private=True, token="hf_x", revision="v1", commit_message="first", include_encoder=True
    )
    assert url.endswith("/commit/123")
    assert [name for name, _ in calls] == ["create_repo", "create_branch", "upload_folder"]
    expected = {"repo_id": "me/flow", "token": "hf_x", "private": True, "repo_type": "model", "exist_ok": True}
    assert calls[0][1] == expected
    assert calls[1][1]["branch"] == "v1" and calls[2][1]["revision"] == "v1"
    upload = calls[2][1]
    assert upload["repo_id"] == "me/flow" and upload["commit_message"] == "first" and upload["token"] == "hf_x"
    pushed = Embedder.load(upload["folder_path"], device="cpu")
    np.testing.assert_array_equal(pushed.encode(SENTENCES), model.encode(SENTENCES))
    assert model.source is None
