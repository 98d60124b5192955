"""Issue 24 (reliability, third round): the last data-loss paths, silent results, tracebacks and the first run.

Each test here is a row of docs/robustness.md ("Third round").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import Embedder
from bertflow.calibrators import StandardNormCalibrator
from bertflow.cli import app
from bertflow.errors import OutputError
from bertflow.hub import push
from bertflow.search import EmbeddingIndex

from .conftest import SENTENCES, invoke, one_line_error, snapshot

runner = CliRunner()
CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]


@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def model(tiny_encoder, tmp_path) -> Path:
    return Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS).save(tmp_path / "model")


# -- 1. --overwrite never deletes what bertflow did not write ----------------------------------------------------


def test_overwrite_refuses_a_model_folder_holding_foreign_files(tiny_model_dir, corpus, model):
    loaded = Embedder.load(model)
    (model / "scores.tsv").write_text("cosine\tscore\n0.5\t3\n", encoding="utf-8")
    (model / "notes").mkdir()
    (model / "notes" / "todo.txt").write_text("mine", encoding="utf-8")
    (model / "calibrator" / "extra.txt").write_text("mine too", encoding="utf-8")
    before = snapshot(model)
    args = ["fit", corpus, "-o", model, "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q"]
    args.append("--overwrite")
    line = one_line_error(invoke(*args), "did not write", "calibrator/extra.txt", "notes/", "scores.tsv")
    assert "todo.txt" not in line  # a foreign sub-folder is named once
    assert snapshot(model) == before
    with pytest.raises(OutputError, match="scores.tsv"):
        loaded.save(model, overwrite=True)
    assert snapshot(model) == before
    # Once they are moved out, --overwrite replaces the model (its README, bundled encoder and lock are its own).
    for name in ("scores.tsv", "notes/todo.txt", "calibrator/extra.txt"):
        (model / name).unlink()
    (model / "notes").rmdir()
    assert invoke(*args).exit_code == 0
    Embedder.load(model).save(model, overwrite=True, include_encoder=True)
    Embedder.load(model).save(model, overwrite=True)


def test_overwrite_refuses_an_index_folder_holding_foreign_files(tiny_encoder, model, tmp_path):
    index = EmbeddingIndex.from_sentences(Embedder.load(model), CORPUS[:6])
    path = index.save(tmp_path / "idx")
    (path / "README.txt").write_text("what this index is for", encoding="utf-8")
    with pytest.raises(OutputError, match="README.txt"):
        index.save(path, overwrite=True)
    assert (path / "README.txt").read_text(encoding="utf-8") == "what this index is for"
    (path / "README.txt").unlink()
    index.save(path, overwrite=True)


# -- 2. encode -o / similarity -o replace only bertflow's own outputs without --overwrite -----------------------


def test_encode_and_similarity_refuse_to_replace_a_file_bertflow_did_not_write(tiny_model_dir, corpus, tmp_path):
    notes = tmp_path / "notes.npy"
    notes.write_text("my notes", encoding="utf-8")
    one_line_error(invoke("encode", corpus, "-o", notes, "--model", tiny_model_dir, "-q"), "--overwrite", "notes.npy")
    assert notes.read_text(encoding="utf-8") == "my notes"
    # A matrix saved by numpy is not bertflow's output either (its header is numpy's 128 bytes, not bertflow's).
    mine = tmp_path / "mine.npy"
    np.save(mine, np.ones((3, 4), dtype=np.float32))
    one_line_error(invoke("encode", corpus, "-o", mine, "--model", tiny_model_dir, "-q"), "--overwrite")
    assert np.array_equal(np.load(mine), np.ones((3, 4), dtype=np.float32))

    out = tmp_path / "vectors.npy"
    assert invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q").exit_code == 0
    first = np.load(out)
    assert first.shape[0] == len(CORPUS)
    assert invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q").exit_code == 0  # its own: replaced
    assert np.array_equal(np.load(out), first)
    assert invoke("encode", corpus, "-o", notes, "--model", tiny_model_dir, "-q", "--overwrite").exit_code == 0
    assert np.array_equal(np.load(notes), first)

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t1\n" for a, b in zip(CORPUS, CORPUS[3:])))
    diary = tmp_path / "diary.tsv"
    diary.write_text("date\tentry\n2026-01-01\tnew year\n", encoding="utf-8")
    args = ["similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q", "-o"]
    one_line_error(invoke(*args, diary), "--overwrite", "diary.tsv")
    assert diary.read_text(encoding="utf-8") == "date\tentry\n2026-01-01\tnew year\n"
    scores = tmp_path / "scores.tsv"
    assert invoke(*args, scores).exit_code == 0
    assert invoke(*args, scores).exit_code == 0  # its own output: replaced
    assert invoke(*args, diary, "--overwrite").exit_code == 0
    assert diary.read_text(encoding="utf-8") == scores.read_text(encoding="utf-8")


# -- 5. CR-only line ends ------------------------------------------------------------------------------------------


def test_cr_only_line_ends_are_refused_not_read_as_one_sentence(tiny_model_dir, tmp_path):
    from bertflow.errors import InputError
    from bertflow.io.text import read_pairs, read_sentences, read_tsv_column

    mac = tmp_path / "mac.txt"
    mac.write_bytes("\r".join(CORPUS[:60]).encode() + b"\r")
    out = tmp_path / "v.npy"
    one_line_error(invoke("encode", mac, "-o", out, "--model", tiny_model_dir, "-q"), "line 1", "carriage return")
    assert not out.exists()
    with pytest.raises(InputError, match="CR-only"):
        read_sentences(mac)
    tsv = tmp_path / "mac.tsv"
    tsv.write_bytes(b"sentence1\tsentence2\tscore\ra\tb\t1\r")
    for read in (lambda: read_tsv_column(tsv, "sentence1"), lambda: read_pairs(tsv)):
        with pytest.raises(InputError, match="carriage return"):
            read()
    # CRLF, and a lone CR that only ends the file, are line ends.
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"one\r\ntwo\r")
    assert read_sentences(ok) == ["one", "two"]


# -- 4. a calibrator fitted with plain .fit(X) ---------------------------------------------------------------------


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


# -- 3. the tokenizer is part of the encoder's identity -------------------------------------------------------------


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


# -- 11. a mistyped -m path, a hub id offline ----------------------------------------------------------------------


def test_a_mistyped_model_path_or_an_offline_hub_id_is_one_line_at_once(corpus, tmp_path, monkeypatch):
    from bertflow import SentenceEncoder
    from bertflow.errors import InputError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    out = tmp_path / "v.npy"
    cases = {
        "../no/such/bert-folder": "no such folder",
        str(tmp_path / "bert-typo"): "no such folder",
        str(corpus): "it is a file",
        "bert-gutenbrg": "HF_HUB_OFFLINE",
        "someone/no-such-model": "HF_HUB_OFFLINE",
    }
    for name, needle in cases.items():
        one_line_error(invoke("encode", corpus, "-o", out, "-m", name, "-q"), repr(name), needle)
        with pytest.raises(InputError, match=needle):
            SentenceEncoder(name)
    assert not out.exists()


# -- 10. similarity --pairs encodes once ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["similarity", "encode"])
def test_the_first_status_line_comes_before_the_model_loads(command, tiny_model_dir, tmp_path, monkeypatch):
    """Item 10: ``bertflow: loading MODEL ...`` on a terminal's stderr before torch and the weights load (16 s of
    silence before); none with -q, none on a pipe (stderr keeps its one-line error)."""
    from bertflow.cli import core, options
    from bertflow.errors import InputError

    def loader(*args, **kwargs):
        raise InputError("the loader ran")

    monkeypatch.setattr(core, "build_encoder", loader)
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: True)
    text = tmp_path / "in.txt"
    text.write_text("A man plays a guitar.\n")
    args = {
        "similarity": ["similarity", "One sentence.", "Another one.", "-m", tiny_model_dir],
        "encode": ["encode", text, "-o", tmp_path / "out.npy", "-m", tiny_model_dir],
    }[command]
    lines = invoke(*args).stderr.splitlines()
    assert lines == [f"bertflow: loading {tiny_model_dir} ...", "bertflow: error: the loader ran"]
    assert invoke(*args, "-q").stderr.splitlines() == ["bertflow: error: the loader ran"]
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: False)
    assert invoke(*args).stderr.splitlines() == ["bertflow: error: the loader ran"]


def test_similarity_pairs_scores_raw_and_calibrated_from_one_pass(tiny_model_dir, tmp_path, monkeypatch):
    from scipy.stats import spearmanr

    from bertflow import SentenceEncoder
    from bertflow.calibrators import IdentityCalibrator

    model_dir = (
        Embedder(SentenceEncoder(str(tiny_model_dir)), StandardNormCalibrator()).fit(CORPUS).save(tmp_path / "m")
    )
    pairs = tmp_path / "pairs.tsv"
    rows = list(zip(CORPUS[:20], CORPUS[7:27], range(20), strict=True))
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s % 5}\n" for a, b, s in rows))
    encoded: list[int] = []
    real = SentenceEncoder.encode

    def counting(self, sentences, *args, **kwargs):
        encoded.append(len(sentences))
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(SentenceEncoder, "encode", counting)
    r = invoke("similarity", "--pairs", pairs, "--model-dir", model_dir, "-q", "-o", tmp_path / "scores.tsv")
    assert r.exit_code == 0, r.output
    assert sum(encoded) == 2 * len(rows)  # each side once: no second pass for the raw encoder
    monkeypatch.setattr(SentenceEncoder, "encode", real)
    model = Embedder.load(model_dir)
    a, b, gold = [x[0] for x in rows], [x[1] for x in rows], [x[2] % 5 for x in rows]
    calibrated = model.similarity_pairwise(a, b)
    raw = Embedder(model.encoder, IdentityCalibrator()).similarity_pairwise(a, b)
    written = [float(line.split("\t")[0]) for line in (tmp_path / "scores.tsv").read_text().splitlines()[1:]]
    np.testing.assert_allclose(written, calibrated, atol=2e-6)
    line = r.stderr.strip().splitlines()[-1]
    raw_rho, calibrated_rho = (spearmanr(x, gold).statistic * 100 for x in (raw, calibrated))
    assert line == (
        f"spearman x100 against the score column ({len(rows)} pairs): raw mean {raw_rho:.2f} | "
        f"standard-norm (m) {calibrated_rho:.2f}"
    )


# -- 12. loading a raw MLM checkpoint: no bars, no LOAD REPORT, one line ----------------------------------------


def test_a_raw_mlm_checkpoint_loads_quietly_with_one_line_about_its_head(tmp_path, capfd, caplog):
    import logging

    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast
    from transformers.utils import logging as hf_logging

    from bertflow import SentenceEncoder

    from .conftest import _write_vocab

    folder = tmp_path / "mlm"
    folder.mkdir()
    _write_vocab(folder)
    vocab = (folder / "vocab.txt").read_text().split()
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)  # weights of a bert.* encoder plus a cls.predictions.* head
    BertTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
    capfd.readouterr()
    verbosity = hf_logging.get_verbosity()
    with caplog.at_level(logging.INFO, logger="bertflow"):
        encoder = SentenceEncoder(str(folder), pooling="cls")
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "LOAD REPORT" not in err and "UNEXPECTED" not in err, err
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1 and "cls.predictions.*" in lines[0] and "pre-training head" in lines[0], lines
    assert hf_logging.get_verbosity() == verbosity  # transformers' own settings are given back
    assert encoder.encode(["A man is playing a guitar."]).shape == (1, 32)


# -- 13. optional dependencies before work; what auto chose ------------------------------------------------------


def test_analyze_without_matplotlib_fails_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    import bertflow.paper.grid as grid

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))

    def no_loading(*args, **kwargs):
        raise AssertionError("the encoder was loaded before the missing dependency was reported")

    monkeypatch.setattr(grid, "load_encoder", no_loading)
    out = tmp_path / "analysis"
    one_line_error(invoke("analyze", "-o", out, "-q"), "matplotlib", "--no-plots")
    assert not out.exists()


def test_auto_logs_what_it_chose_and_why(anisotropic_data, caplog):
    import logging

    from bertflow.calibrators import AutoCalibrator

    with caplog.at_level(logging.INFO, logger="bertflow.calibrators.auto"):
        cal = AutoCalibrator().fit(anisotropic_data)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "bertflow.calibrators.auto"]
    # What it read (the anisotropy of X here: no encoder probe), what it concluded, and the settings it chose.
    assert line.startswith("auto: embedding anisotropy ") and "reliability" in line, line
    kind = "a raw MLM encoder" if cal.rawness_ >= 0.5 else "a sentence encoder"
    assert kind in line and f"alpha {cal.alpha_:.2f}" in line, line


def test_help_shows_no_bool_metavar_after_flags():
    for command in (["encode", "--help"], ["fit", "--help"], ["--help"]):
        text = runner.invoke(app, command).stdout
        flagged = [line for line in text.splitlines() if "<bool>" in line and "--help" not in line]
        assert not flagged, flagged


# -- 7. tracebacks become one-line errors ------------------------------------------------------------------------


def test_a_full_disk_inside_the_safetensors_write_is_one_line(tiny_model_dir, corpus, tmp_path, monkeypatch):
    import builtins
    import errno

    import bertflow.io.formats as formats

    class FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[: len(data) // 2])  # part of it fits, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        fh = builtins.open(path, mode, *args, **kwargs)
        return FullDisk(fh) if str(path).endswith(".safetensors") and "w" in mode else fh

    monkeypatch.setattr(formats, "open", open_on_a_full_disk, raising=False)
    out = tmp_path / "m"
    args = ["fit", corpus, "-o", out, "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q"]
    one_line_error(invoke(*args), "disk full", status=1)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]


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


# -- 6. load_calibrated checks the module list --------------------------------------------------------------------


def test_load_calibrated_refuses_an_edited_module_list(tiny_model_dir, tmp_path, monkeypatch):
    import json
    import shutil

    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from bertflow.errors import ModelFileError
    from bertflow.integrations.sentence_transformers import fit_calibrator, load_calibrated

    base = SentenceTransformer(modules=[Transformer(str(tiny_model_dir)), Pooling(32, "mean")], device="cpu")
    saved = tmp_path / "st"
    fit_calibrator(base, CORPUS, "whitening-8", portable=False).save(str(saved))
    expected = load_calibrated(str(saved), device="cpu").encode(CORPUS[:3])
    # The Calibration entry deleted from modules.json: the uncalibrated model would load without a word.
    dropped = tmp_path / "dropped"
    shutil.copytree(saved, dropped)
    modules = json.loads((dropped / "modules.json").read_text())
    (dropped / "modules.json").write_text(json.dumps([m for m in modules if "Calibration" not in m["type"]]))
    with pytest.raises(ModelFileError, match="does not list"):
        load_calibrated(str(dropped), device="cpu")
    # The Calibration folder deleted: a one-line error, not sentence-transformers' traceback.
    missing = tmp_path / "missing"
    shutil.copytree(saved, missing)
    shutil.rmtree(missing / "2_Calibration")
    with pytest.raises(ModelFileError, match="missing"):
        load_calibrated(str(missing), device="cpu")
    # A hub id offline and not cached: one line naming HF_HUB_OFFLINE.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelFileError, match="HF_HUB_OFFLINE"):
        load_calibrated("someone/no-such-calibrated-model")
    np.testing.assert_array_equal(load_calibrated(str(saved), device="cpu").encode(CORPUS[:3]), expected)


def test_load_calibrated_checks_the_checksums_the_export_wrote(tiny_model_dir, tmp_path):
    """The export's save writes the sha256 of every file it wrote; a Dense weight edited x1e30 (which would give
    1e29-sized vectors) is refused with one line naming the file; the clean folder loads, also without bertflow."""
    import json
    import shutil

    pytest.importorskip("sentence_transformers")
    from safetensors.torch import load_file, save_file
    from sentence_transformers import SentenceTransformer

    from bertflow import SentenceEncoder, WhiteningCalibrator
    from bertflow.errors import ModelFileError
    from bertflow.integrations.sentence_transformers import CHECKSUM_FILE, from_embedder, load_calibrated

    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), device="cpu"), WhiteningCalibrator(8)).fit(CORPUS)
    saved = tmp_path / "st"
    from_embedder(embedder).save(str(saved))
    listed = json.loads((saved / CHECKSUM_FILE).read_text())["files"]
    (dense,) = [p for p in saved.glob("*_Dense")]
    weights = f"{dense.name}/model.safetensors"
    assert weights in listed and "modules.json" in listed and "model.safetensors" in listed
    clean = load_calibrated(str(saved), device="cpu").encode(CORPUS[:3])
    np.testing.assert_allclose(clean, embedder.encode(CORPUS[:3]), atol=1e-4)
    assert SentenceTransformer(str(saved), device="cpu").encode(CORPUS[:1]).shape == (1, 8)  # plain ST ignores it
    tampered = tmp_path / "tampered"
    shutil.copytree(saved, tampered)
    state = load_file(tampered / weights)
    save_file({k: v * 1e30 if v.ndim == 2 else v for k, v in state.items()}, tampered / weights)
    with pytest.raises(ModelFileError, match="model.safetensors does not match its checksum") as caught:
        load_calibrated(str(tampered), device="cpu")
    assert "\n" not in str(caught.value) and dense.name in str(caught.value)
    # A listed file deleted is refused too, naming it.
    (tampered / weights).unlink()
    with pytest.raises(ModelFileError, match="is missing"):
        load_calibrated(str(tampered), device="cpu")


# -- 8. messages that named the wrong thing ------------------------------------------------------------------------


def test_an_empty_tsv_cell_is_named_by_file_line_and_column(tiny_model_dir, tmp_path):
    tsv = tmp_path / "train.tsv"
    rows = [f"{a}\t{b}" for a, b in zip(CORPUS[:10], CORPUS[10:20], strict=True)]
    rows[6] = f"{CORPUS[6]}\t   "
    tsv.write_text("sentence1\tsentence2\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "m"
    args = ["fit", tsv, "-c", "sentence1", "-c", "sentence2", "-o", out, "--model", tiny_model_dir, "-q"]
    one_line_error(invoke(*args), "train.tsv: line 8, column 'sentence2' is empty")
    assert not out.exists()


@pytest.mark.parametrize(
    ("encoding", "bom", "expected"),
    [
        ("utf-16-le", b"", "UTF-16LE without a byte-order mark"),
        ("utf-16-be", b"", "UTF-16BE without a byte-order mark"),
        ("utf-16-le", b"\xff\xfe", "UTF-16LE with a byte-order mark"),
        ("utf-16-be", b"\xfe\xff", "UTF-16BE with a byte-order mark"),
    ],
)
def test_utf16_advice_names_the_byte_order_and_the_mark(tmp_path, encoding, bom, expected):
    from bertflow.errors import InputError
    from bertflow.io.text import read_sentences

    path = tmp_path / "u16.txt"
    path.write_bytes(bom + "A man plays a guitar.\nA dog runs.\n".encode(encoding))
    with pytest.raises(InputError, match=expected):
        read_sentences(path)


def test_search_query_does_not_blame_the_index_for_a_bad_backend_or_a_model_folder(model, tmp_path):
    index = EmbeddingIndex.from_sentences(Embedder.load(model), CORPUS[:6]).save(tmp_path / "idx")
    one_line_error(invoke("search", "query", index, "a man", "--backend", "bogus", "-q"), "--backend", "'bogus'")
    line = one_line_error(invoke("search", "query", model, "a man", "-q"), "model folder, not a search index")
    assert "damaged" not in line and "missing" not in line
    r = invoke("search", "query", index, "a man", "-q", "--top-k", "2")
    assert r.exit_code == 0, r.output


def test_push_to_hub_offline_is_one_error_naming_hf_hub_offline(tiny_encoder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    model = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    with pytest.raises(OutputError, match="HF_HUB_OFFLINE") as caught:
        push(model, "someone/my-flow", include_encoder=True)  # a local encoder is pushed only bundled
    assert "\n" not in str(caught.value)


def test_a_store_encoded_before_the_tokenizer_fingerprint_still_resumes(tiny_model_dir, corpus, tmp_path):
    import json

    from bertflow.scale.layout import MANIFEST_NAME

    store = tmp_path / "emb"
    args = ["distributed-encode", corpus, "-o", store, "--model", tiny_model_dir, "-q", "--chunk-size", "16"]
    args += ["--shard-size", "32"]
    assert invoke(*args).exit_code == 0
    manifest = json.loads((store / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert manifest["encoder"].pop("tokenizer_fingerprint").startswith("t1-")
    (store / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    r = invoke(*args)  # the earlier record lacks the key: resumed, not "encoder differs"
    assert r.exit_code == 0, r.stderr
    manifest["encoder"]["tokenizer_fingerprint"] = "t1-0000000000000000"
    (store / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    one_line_error(invoke(*args), "encoder")  # a recorded, different tokenizer is another encoder
