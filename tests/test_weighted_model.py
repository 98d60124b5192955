"""A frequency-weighted pooling end to end: fit counts the tokens, the folder keeps them, every path reloads the
same vectors, and the CLI's --weighting / --token-stats."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertflow import Embedder, InputError, SentenceEncoder
from bertflow.calibrators import WhiteningCalibrator
from bertflow.card import model_card
from bertflow.errors import CompatibilityError, ModelFileError

from .conftest import SENTENCES

OTHER = ["the dog plays on the guitar", "a cat is the music", "the man", "the woman is playing"]


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
    back = Embedder.load(tmp_path / "m")
    assert back.encoder.token_statistics == encoder.token_statistics
    assert np.array_equal(back.encode(OTHER), before)
    assert back.similarity(OTHER[0], OTHER[1]) == pytest.approx(model.similarity(OTHER[0], OTHER[1]), abs=1e-6)

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


def test_encode_multi_device_carries_the_statistics(encoder):
    from bertflow.encoding.multiprocess import encode_multi_device

    encoder.token_statistics = encoder.count_tokens(SENTENCES)
    got = encode_multi_device(SENTENCES, encoder, ["cpu", "cpu"], threads_per_process=1, chunk_size=4)
    np.testing.assert_allclose(got, encoder.encode(SENTENCES), atol=1e-6)


def test_cli_fit_with_weighting_and_token_stats(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from bertflow.cli import app

    corpus = tmp_path / "fit.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("\n".join(OTHER) + "\n", encoding="utf-8")
    common = ["fit", str(corpus), "-m", str(tiny_model_dir), "--calibrator", "whitening-4", "-q", "--device", "cpu"]
    runner = CliRunner()
    result = runner.invoke(app, [*common, "-o", str(tmp_path / "m"), "--pooling", "mean", "--weighting", "idf",
                                 "--token-stats", str(tokens), "--token-source", "both"])
    assert result.exit_code == 0, result.output
    model = Embedder.load(tmp_path / "m")
    assert model.encoder.pooling.name == "idf:mean"
    assert model.encoder.token_statistics == model.encoder.count_tokens(SENTENCES * 3 + OTHER)
    bad = runner.invoke(app, [*common, "-o", str(tmp_path / "x"), "--pooling", "sif:mean", "--weighting", "idf"])
    assert bad.exit_code == 2 and "give the weighting once" in bad.output
    assert not (tmp_path / "x").exists()


def test_card_records_the_statistics_and_export(encoder, tmp_path):
    model = Embedder(encoder, WhiteningCalibrator(n_components=4)).fit(SENTENCES * 3)
    card = model_card(model)
    assert f"| token statistics (digest) | `{encoder.token_statistics.digest()}` |" in card
    assert "token_statistics/" in card
    export = "| sentence-transformers export | `from_embedder(model)`: the pooling and the calibrator"
    assert export in card
    assert "without bertflow |" in card
    pooler = Embedder(SentenceEncoder(encoder.model_id, pooling="pooler", device="cpu"), WhiteningCalibrator())
    assert "| sentence-transformers export | not possible" in model_card(pooler.fit(SENTENCES * 3))


def test_distributed_encode_refuses_a_weighted_raw_encoder_before_any_rank(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from bertflow.cli import app

    text = tmp_path / "in.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        app, ["distributed-encode", str(text), "-o", str(tmp_path / "store"), "-m", str(tiny_model_dir),
              "--pooling", "sif:mean"]
    )
    assert result.exit_code == 2 and "needs token statistics" in result.output
    assert not (tmp_path / "store").exists()
