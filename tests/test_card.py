"""The model card (card.py): hub-ready front matter, licence and provenance, token statistics."""

from __future__ import annotations

import json

from bertflow import (
    Embedder,
    SentenceEncoder,
    WhiteningCalibrator,
)
from bertflow.card import encoder_license, model_card

from .conftest import SENTENCES
from .test_embedder import CORPUS, encoder, fitted  # noqa: F401 - the fixtures


def front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_model_card_is_hub_ready(fitted, tmp_path, monkeypatch):  # noqa: F811
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


def test_card_records_the_statistics_and_export(encoder, tmp_path):  # noqa: F811
    model = Embedder(encoder, WhiteningCalibrator(n_components=4)).fit(SENTENCES * 3)
    card = model_card(model)
    assert f"| token statistics (digest) | `{encoder.token_statistics.digest()}` |" in card
    assert "token_statistics/" in card
    export = "| sentence-transformers export | `from_embedder(model)`: the pooling and the calibrator"
    assert export in card
    assert "without bertflow |" in card
    pooler = Embedder(SentenceEncoder(encoder.model_id, pooling="pooler", device="cpu"), WhiteningCalibrator())
    assert "| sentence-transformers export | not possible" in model_card(pooler.fit(SENTENCES * 3))
