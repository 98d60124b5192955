"""The encoder record (model_folder.encoder_record), the weights fingerprint (encoding.loading, memoised), one
fingerprint of a calibrator, one compatibility check; and
io.formats.check_format, the one format-version check of every loader."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator
from bertflow.calibrators import Calibrator
from bertflow.calibrators.base import calibrator_fingerprint
from bertflow.cli import app
from bertflow.errors import CompatibilityError, ModelFileError
from bertflow.io.formats import check_format
from bertflow.model_folder import ENCODER_KEYS, FIT_RECORD_KEYS, check_fitted_on, corpus_digest

from .conftest import SENTENCES
from .test_imports import HEAVY, loaded_after

CORPUS = [f"{s} ({i})" for i, s in enumerate(SENTENCES * 8)]


def test_the_three_fitting_routes_record_the_same_keys(tiny_model_dir, tmp_path):
    """Embedder.fit, `bertflow distributed-fit` and the sentence-transformers fit_calibrator used to build their
    fitting records (and encoder records) separately, with drifting keys; they now share one builder each."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from bertflow.integrations.sentence_transformers import fit_calibrator

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


def test_check_format_names_the_file_and_the_way_out(tmp_path):
    path = tmp_path / "config.json"
    assert check_format({"format_version": 1}, path, kind="model") == 1
    with pytest.raises(ModelFileError, match=r"config.json is a model written by bertflow 9.9 in format 2; .* upgrade"):
        check_format({"format_version": 2, "bertflow_version": "9.9"}, path, kind="model")
    assert check_format({"format_version": 2}, path, kind="embedding store", current=2) == 2
    for edited in ({}, {"format_version": "1"}, {"format_version": True}, {"format_version": 1.0}):
        with pytest.raises(ModelFileError, match="config.json has no valid format_version .* was it edited"):
            check_format(edited, path, kind="model")


def test_a_calibrator_of_a_newer_format_is_refused_as_a_model_file_error(anisotropic_data, tmp_path):
    WhiteningCalibrator().fit(anisotropic_data).save(tmp_path / "cal")
    config_path = tmp_path / "cal" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "format_version": 99}))
    with pytest.raises(ModelFileError, match=r"cal/config.json is a calibrator written by .* upgrade bertflow"):
        Calibrator.load(tmp_path / "cal")


def test_the_format_modules_are_light():
    """Stores, indexes and the CLI's early checks import these without loading torch or scikit-learn."""
    code = "import bertflow.typing, bertflow.hub, bertflow.io.formats"
    assert loaded_after(code) == dict.fromkeys(HEAVY, False)


def test_the_weights_fingerprint_is_hashed_once_per_process_per_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    """Loading the same checkpoint files again reuses the fingerprint (memo keyed by the files' stat); a changed
    file is hashed again; an encoder built from a model object is always hashed."""
    import os
    import shutil

    from bertflow.encoding import loading

    calls = []
    real = loading._hash_weights
    monkeypatch.setattr(loading, "_hash_weights", lambda *a: calls.append(1) or real(*a))
    folder = shutil.copytree(tiny_model_dir, tmp_path / "enc")
    first = SentenceEncoder(str(folder), device="cpu").fingerprint()
    second = SentenceEncoder(str(folder), device="cpu").fingerprint()
    assert first == second and len(calls) == 1
    config = folder / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # touched: hashed again
    assert SentenceEncoder(str(folder), device="cpu").fingerprint() == first and len(calls) == 2
    built = SentenceEncoder(str(folder), device="cpu")
    in_memory = SentenceEncoder(model=built.model, tokenizer=built.tokenizer, device="cpu")
    assert in_memory.fingerprint() == first and len(calls) == 3
