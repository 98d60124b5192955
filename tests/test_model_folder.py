"""What a model folder records about its encoder (model_folder.encoder_record: the same keys on every fitting route,
the hub commit it is pinned to, its source, the tokenizer as part of its identity) and the one compatibility check
(check_fitted_on). The calibrator fingerprint's tests are in calibrators/test_base.py, check_format's in
io/test_formats.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import (
    CompatibilityError,
    Embedder,
    SentenceEncoder,
    WhiteningCalibrator,
)
from bertflow.calibrators import StandardNormCalibrator
from bertflow.cli import app
from bertflow.model_folder import CONFIG_FILE, ENCODER_KEYS, FIT_RECORD_KEYS, check_fitted_on, corpus_digest

from .conftest import SENTENCES
from .test_embedder import fitted  # noqa: F401 - the fixture

CORPUS = [f"{s} ({i})" for i, s in enumerate(SENTENCES * 8)]


def test_the_three_fitting_routes_record_the_same_keys(tiny_model_dir, tmp_path):
    """Embedder.fit, `bertflow distributed-fit` and the sentence-transformers fit_calibrator used to build their
    fitting records (and encoder records) separately, with drifting keys; they now share one builder each."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from bertflow.integrations.st_export import fit_calibrator

    encoder = SentenceEncoder(str(tiny_model_dir), device="cpu", pooling="mean", max_length=64)
    local = Embedder(encoder, WhiteningCalibrator(8)).fit(CORPUS, regime="target")

    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    runner = CliRunner()
    store, model = tmp_path / "store", tmp_path / "model"
    encode = ["distributed-encode", str(corpus_file), "-o", str(store), "--model", str(tiny_model_dir)]
    r = runner.invoke(app, [*encode, "--pooling", "mean", "--max-length", "64", "--device", "cpu", "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["distributed-fit", str(store), "-o", str(model), "--calibrator", "whitening-8", "-q"])
    assert r.exit_code == 0, r.output
    distributed = Embedder.load(model)

    base = st.SentenceTransformer(modules=[Transformer(str(tiny_model_dir), max_seq_length=64), Pooling(32, "mean")])
    module = fit_calibrator(base, CORPUS, WhiteningCalibrator(8), portable=False)[-1]

    records = {
        "Embedder.fit": local.fit_info,
        "distributed-fit": distributed.fit_info,
        "fit_calibrator": module.fitting,
    }
    for route, record in records.items():
        assert sorted(record) == sorted(FIT_RECORD_KEYS), route  # a saved record comes back key-sorted
        assert record["n_sentences"] == len(CORPUS) and record["machine"], route
    assert local.fit_info["corpus_sha256"] == module.fitting["corpus_sha256"] == corpus_digest(CORPUS)
    # A distributed fit never holds the sentences: it names the file it read instead.
    assert distributed.fit_info["corpus_sha256"] is None and distributed.fit_info["corpus_file_sha256"]

    fitted_on = {
        "Embedder.fit": local.fitted_on,
        "distributed-fit": distributed.fitted_on,
        "fit_calibrator": module.fitted_on,
    }
    for route, record in fitted_on.items():
        assert sorted(record) == sorted((*ENCODER_KEYS, "framework")), route
    # The same checkpoint, pooling and truncation, whichever library encoded it.
    for key in ("fingerprint", "pooling", "max_length", "dim"):
        assert len({json.dumps(record[key]) for record in fitted_on.values()}) == 1, key
    assert fitted_on["fit_calibrator"]["framework"] == "sentence-transformers"


def test_check_fitted_on_refuses_another_encoder_but_not_an_unknown_value(anisotropic_data):
    cal = WhiteningCalibrator().fit(anisotropic_data)
    dim = anisotropic_data.shape[1]
    ours = {"model": "m", "fingerprint": "w2-aaaa", "pooling": "mean", "max_length": 64, "dim": dim}
    check_fitted_on(cal, ours)  # nothing recorded: only the dimension is checked
    with pytest.raises(CompatibilityError, match=f"{dim}-dimensional embeddings, but m gives {dim + 1}"):
        check_fitted_on(cal, {**ours, "dim": dim + 1})
    recorded = dict(ours)
    check_fitted_on(cal, ours, recorded)
    check_fitted_on(cal, {**ours, "fingerprint": None}, recorded)  # not computable at hand: not compared
    with pytest.raises(CompatibilityError, match="pooling='mean' .* this encoder has pooling='cls'"):
        check_fitted_on(cal, {**ours, "pooling": "cls"}, recorded)
    recorded["fingerprint"] = "0123456789abcdef"  # another encoder's
    with pytest.raises(CompatibilityError, match="fingerprint='0123456789abcdef'.*refit \\(fingerprint was"):
        check_fitted_on(cal, ours, recorded, advice=lambda key, recorded: f"refit ({key} was {recorded})")


def test_source_is_recorded(fitted, tmp_path):  # noqa: F811
    path = fitted.save(tmp_path / "model")
    assert fitted.source == str(path.resolve())
    assert Embedder.load(path, device="cpu").source == str(path.resolve())


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


def test_an_edited_tokenizer_is_refused_like_changed_weights(tmp_path):
    import json
    import shutil

    from bertflow import SentenceEncoder
    from bertflow.errors import CompatibilityError

    from .conftest import make_tiny_bert

    enc_dir = make_tiny_bert(tmp_path / "enc")
    encoder = SentenceEncoder(str(enc_dir), pooling="mean")
    saved = Embedder(encoder, StandardNormCalibrator()).fit(CORPUS).save(tmp_path / "model")
    before = encoder.tokenizer_fingerprint()
    assert before.startswith("t1-") and SentenceEncoder(str(enc_dir)).tokenizer_fingerprint() == before
    # Lowercasing off: the same weights and vocabulary, other token ids for "Hello WORLD".
    config_file = enc_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["do_lower_case"] = False
    config_file.write_text(json.dumps(config), encoding="utf-8")
    tok_file = enc_dir / "tokenizer.json"
    tok = json.loads(tok_file.read_text(encoding="utf-8"))
    tok["normalizer"]["lowercase"] = False
    tok_file.write_text(json.dumps(tok), encoding="utf-8")
    edited = SentenceEncoder(str(enc_dir), pooling="mean")
    assert edited.fingerprint() == encoder.fingerprint()  # the weights did not change ...
    assert edited.tokenizer_fingerprint() != before  # ... the pipeline did
    with pytest.raises(CompatibilityError, match="tokenizer_fingerprint"):
        Embedder.load(saved)
    # A folder saved before the tokenizer was recorded (no tokenizer_fingerprint) still loads: nothing to compare.
    old = tmp_path / "old"
    shutil.copytree(saved, old)
    # The encoder record lives in bertflow_config.json (the model folder's own config, not a checksummed file).
    top = json.loads((old / "bertflow_config.json").read_text(encoding="utf-8"))
    assert top["calibrator"]["fitted_on"].pop("tokenizer_fingerprint")
    top["encoder"].pop("tokenizer_fingerprint", None)
    (old / "bertflow_config.json").write_text(json.dumps(top), encoding="utf-8")
    assert Embedder.load(old).encoder.tokenizer_fingerprint() == edited.tokenizer_fingerprint()
