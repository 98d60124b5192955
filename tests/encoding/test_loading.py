"""Loading a checkpoint (encoding/loading.py): the weights fingerprint, missing models, raw MLM checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding.loading import FINGERPRINT_SCHEME
from bertflow.errors import CompatibilityError

from ..conftest import SENTENCES


def test_the_weights_fingerprint_is_hashed_once_per_process_per_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    """Loading the same checkpoint files again reuses the fingerprint (memo keyed by the files' stat); a changed
    file is hashed again; an encoder built from a model object is always hashed."""
    import os

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


def test_a_raw_mlm_checkpoint_loads_quietly_with_one_line_about_its_head(tmp_path, capfd, caplog):
    import logging

    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast
    from transformers.utils import logging as hf_logging

    from ..conftest import _write_vocab

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


def test_fingerprint_identifies_weights_not_precision(tiny_model_dir, other_tiny_model_dir):
    a = SentenceEncoder(str(tiny_model_dir), device="cpu")
    b = SentenceEncoder(str(tiny_model_dir), device="cpu", dtype="bfloat16")
    c = SentenceEncoder(str(other_tiny_model_dir), device="cpu")
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="cannot load the encoder"):
        SentenceEncoder(str(tmp_path / "no-such-model"))


def test_fingerprint_covers_every_layer(tiny_model_dir, tmp_path):
    """Two encoders that differ only in one deep layer's weights (same config, vocabulary and embeddings) get
    different fingerprints, so a calibrator fitted on one is refused on the other."""
    other = _retrain_one_deep_layer(tiny_model_dir, tmp_path / "retrained")
    a = SentenceEncoder(str(tiny_model_dir), device="cpu")
    b = SentenceEncoder(str(other), device="cpu")
    torch.testing.assert_close(a.model.get_input_embeddings().weight, b.model.get_input_embeddings().weight)
    assert not np.allclose(a.encode(SENTENCES), b.encode(SENTENCES))
    assert a.fingerprint().startswith(FINGERPRINT_SCHEME) and b.fingerprint().startswith(FINGERPRINT_SCHEME)
    assert a.fingerprint() != b.fingerprint()


def test_a_folder_recording_another_fingerprint_is_refused(tiny_encoder, tmp_path):
    """A folder whose calibrator was fitted on an encoder of another fingerprint is refused, naming it."""
    from bertflow import Embedder, StandardNormCalibrator

    folder = Embedder(tiny_encoder, StandardNormCalibrator()).fit(SENTENCES).save(tmp_path / "m")
    top = json.loads((folder / "bertflow_config.json").read_text())
    top["calibrator"]["fitted_on"]["fingerprint"] = "0123456789abcdef"
    (folder / "bertflow_config.json").write_text(json.dumps(top))
    with pytest.raises(CompatibilityError, match="fingerprint='0123456789abcdef'.*refit"):
        Embedder.load(folder)


def _retrain_one_deep_layer(source: Path, dest: Path) -> Path:
    """Copy the tiny BERT in ``source`` to ``dest`` with only the last layer's feed-forward weights changed (same
    config, vocabulary and embedding matrix: what the first fingerprint scheme hashed)."""
    from transformers import BertModel

    shutil.copytree(source, dest)
    model = BertModel.from_pretrained(str(source))
    with torch.no_grad():
        model.encoder.layer[-1].output.dense.weight.mul_(1.5)
    model.save_pretrained(str(dest))
    return dest
