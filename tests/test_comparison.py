"""Several fitted models side by side: ``bertflow similarity --pairs P --model-dir A --model-dir B``
(:mod:`bertflow.comparison`): one encoder pass, one column per model, a raw score per pooling, refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from bertflow import Embedder, SentenceEncoder
from bertflow.calibrators import AnchoredWhiteningCalibrator, IdentityCalibrator, WhiteningCalibrator
from bertflow.io.files import written_by_bertflow

from .conftest import SENTENCES, invoke

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]
PAIRS = [(CORPUS[i], CORPUS[i + 7], i % 5) for i in range(20)]


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Whitening on mean pooling and anchored whitening on first-last-avg, both on the tiny encoder."""
    root = tmp_path_factory.mktemp("compared")
    white = Embedder(SentenceEncoder(str(tiny_model_dir), pooling="mean"), WhiteningCalibrator()).fit(CORPUS)
    anchored = Embedder(
        SentenceEncoder(str(tiny_model_dir), pooling="first-last-avg"), AnchoredWhiteningCalibrator()
    ).fit(CORPUS)
    return {"white": white.save(root / "white"), "anch": anchored.save(root / "anch")}


@pytest.fixture()
def pairs(tmp_path) -> Path:
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS))
    return path


@pytest.fixture()
def encoded(monkeypatch) -> list[int]:
    """Sentences given to ``SentenceEncoder.encode``, per call."""
    calls: list[int] = []
    real = SentenceEncoder.encode

    def counting(self, sentences, *args, **kwargs):
        calls.append(len(sentences))
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(SentenceEncoder, "encode", counting)
    return calls


def _rho(x) -> str:
    return f"{spearmanr(x, [s for _, _, s in PAIRS]).statistic * 100:.2f}"


def test_two_models_one_pass_one_column_each(models, pairs, tmp_path, encoded, tiny_model_dir):
    out = tmp_path / "scores.tsv"
    args = ["similarity", "--pairs", pairs, "--model-dir", models["white"], "--model-dir", models["anch"], "-q"]
    r = invoke(*args, "-o", out)
    assert r.exit_code == 0, r.output
    assert encoded == [2 * len(PAIRS)]  # both sides, both poolings: one call, one forward pass
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == ["cosine:white", "cosine:anch", "sentence1", "sentence2", "score"]
    assert [row[2:] for row in rows[1:]] == [[a, b, str(s)] for a, b, s in PAIRS]
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    expected = {name: Embedder.load(path).similarity_pairwise(a, b) for name, path in models.items()}
    for column, name in enumerate(("white", "anch")):
        np.testing.assert_allclose([float(row[column]) for row in rows[1:]], expected[name], atol=2e-6)
    raw = {
        pooling: Embedder(
            SentenceEncoder(str(tiny_model_dir), pooling=pooling), IdentityCalibrator()
        ).similarity_pairwise(a, b)
        for pooling in ("mean", "first-last-avg")
    }
    assert r.stderr.strip().splitlines()[-1] == (
        f"spearman x100 against the score column ({len(PAIRS)} pairs): raw mean {_rho(raw['mean'])} | "
        f"raw first-last-avg {_rho(raw['first-last-avg'])} | whitening (white) {_rho(expected['white'])} | "
        f"anchored (anch) {_rho(expected['anch'])}"
    )
    # The file is bertflow's own output: the same command replaces it without --overwrite.
    assert written_by_bertflow(out)
    before = out.read_text(encoding="utf-8")
    r = invoke(*args, "-o", out)
    assert r.exit_code == 0, r.output
    assert out.read_text(encoding="utf-8") == before


def test_one_model_output_is_unchanged(models, pairs, tmp_path, encoded):
    out = tmp_path / "scores.tsv"
    r = invoke("similarity", "--pairs", pairs, "--model-dir", models["white"], "-q", "-o", out)
    assert r.exit_code == 0, r.output
    assert encoded == [2 * len(PAIRS)]
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == ["cosine", "sentence1", "sentence2", "score"]
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    model = Embedder.load(models["white"])
    calibrated = model.similarity_pairwise(a, b)
    np.testing.assert_allclose([float(row[0]) for row in rows[1:]], calibrated, atol=2e-6)
    raw = Embedder(model.encoder, IdentityCalibrator()).similarity_pairwise(a, b)
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .endswith(f"({len(PAIRS)} pairs): raw mean {_rho(raw)} | whitening (white) {_rho(calibrated)}")
    )


@pytest.mark.parametrize("change", ["weights", "max_length"])
def test_models_on_different_encoders_are_refused_before_any_encoding(
    change, models, pairs, tmp_path, encoded, tiny_model_dir, other_tiny_model_dir
):
    source, max_length = (other_tiny_model_dir, 64) if change == "weights" else (tiny_model_dir, 32)
    other = Embedder(SentenceEncoder(str(source), pooling="mean", max_length=max_length), WhiteningCalibrator())
    other = other.fit(CORPUS).save(tmp_path / "other")
    encoded.clear()  # the fit above encoded; the command must not
    out = tmp_path / "scores.tsv"
    r = invoke("similarity", "--pairs", pairs, "--model-dir", models["white"], "--model-dir", other, "-o", out)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    key = "fingerprint" if change == "weights" else "max_length"
    assert f"--model-dir {other} was fitted on another encoder than {models['white']} ({key} " in r.stderr
    assert encoded == [] and not out.exists()


def test_the_same_folder_twice_is_refused(models, pairs):
    r = invoke("similarity", "--pairs", pairs, "--model-dir", models["white"], "--model-dir", models["white"])
    assert r.exit_code == 2 and "is given twice" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_two_sentences_with_several_models_print_one_line_each(models):
    r = invoke("similarity", PAIRS[0][0], PAIRS[0][1], "--model-dir", models["white"], "--model-dir", models["anch"])
    assert r.exit_code == 0, r.output
    lines = [line.split("\t") for line in r.stdout.splitlines()]
    assert [name for _, name in lines] == ["white", "anch"]
    for (cos, _), path in zip(lines, (models["white"], models["anch"]), strict=True):
        assert float(cos) == pytest.approx(float(Embedder.load(path).similarity(PAIRS[0][0], PAIRS[0][1])), abs=2e-6)


def test_weighted_poolings_with_their_own_token_statistics(tiny_model_dir, pairs, tmp_path, encoded):
    """Two SIF models whose weights come from different corpora: one pass per set of statistics, each model's
    cosines as its own Embedder gives them, and the raw line names the model when a pooling repeats."""
    folders = []
    for name, corpus in (("sif-a", CORPUS[:40]), ("sif-b", CORPUS[24:])):
        encoder = SentenceEncoder(str(tiny_model_dir), pooling="sif:mean")
        folders.append(Embedder(encoder, WhiteningCalibrator()).fit(corpus).save(tmp_path / name))
    encoded.clear()
    out = tmp_path / "scores.tsv"
    r = invoke("similarity", "--pairs", pairs, "--model-dir", folders[0], "--model-dir", folders[1], "-q", "-o", out)
    assert r.exit_code == 0, r.output
    assert encoded == [2 * len(PAIRS)] * 2
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    for column, folder in enumerate(folders):
        expected = Embedder.load(folder).similarity_pairwise(a, b)
        np.testing.assert_allclose([float(row[column]) for row in rows[1:]], expected, atol=2e-6)
    assert "raw sif:mean (sif-a) " in r.stderr and "raw sif:mean (sif-b) " in r.stderr


def test_written_by_bertflow_knows_multi_model_tsvs(tmp_path):
    for header, ours in (("cosine:a\tcosine:b\tsentence1", True), ("cosine:\tx", False), ("cosines\tx", False)):
        path = tmp_path / "t.tsv"
        path.write_text(f"{header}\n0.5\t0.25\tx\n", encoding="utf-8")
        assert written_by_bertflow(path) is ours, header
