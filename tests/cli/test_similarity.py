"""`bertflow similarity` end to end: sentence pairs, pairs files, raw and calibrated scores."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import Embedder
from bertflow.calibrators import StandardNormCalibrator

from ..conftest import CORPUS, SENTENCES, cli, invoke, one_line_error


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


def test_similarity_pairs_file(tiny_model_dir, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "score\tsentence1\tsentence2\n"
        + "".join(f"{i % 5}\t{SENTENCES[i]}\t{SENTENCES[-1 - i]}\n" for i in range(len(SENTENCES))),
        encoding="utf-8",
    )
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-o", tmp_path / "out.tsv")
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "out.tsv").read_text().splitlines()
    # The cosine, then the input's columns unchanged.
    assert rows[0] == "cosine\tscore\tsentence1\tsentence2" and len(rows) == len(SENTENCES) + 1
    assert rows[1].split("\t")[1:] == ["0", SENTENCES[0], SENTENCES[-1]]
    assert "spearman" in r.stderr


def test_similarity_pairs_without_score_keeps_extra_columns(tiny_model_dir, tmp_path):
    """Only sentence1 and sentence2 are required; an id (or any column) travels with its pair, in input order."""
    pairs = tmp_path / "pairs.tsv"
    rows_in = [(f"q{i}", SENTENCES[i], SENTENCES[-1 - i]) for i in range(4)]
    pairs.write_text(
        "sentence1\tid\tsentence2\n" + "".join(f"{a}\t{i}\t{b}\n" for i, a, b in rows_in), encoding="utf-8"
    )
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q")
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    assert out[0] == "cosine\tsentence1\tid\tsentence2" and len(out) == 5
    from bertflow import Embedder, SentenceEncoder
    from bertflow.calibrators import IdentityCalibrator

    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), pooling="mean"), IdentityCalibrator())
    expected = embedder.similarity_pairwise([a for _, a, _ in rows_in], [b for _, _, b in rows_in])
    for line, (i, a, b), cos in zip(out[1:], rows_in, expected, strict=True):
        fields = line.split("\t")
        assert fields[1:] == [a, i, b]
        assert float(fields[0]) == pytest.approx(float(cos), abs=2e-6)
    assert "spearman" not in r.stderr  # no score column, no correlation
    pairs.write_text("sentence1\tid\n" + "a\t1\n", encoding="utf-8")
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir)
    assert r.exit_code == 2 and "columns sentence1 and sentence2" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "CORPUS", "-o", "OUT", "--calibrator", "standard-norm"],
        ["encode", "CORPUS", "-o", "OUT.npy"],
        ["similarity", "a b", "c d"],
    ],
)
def test_threads_option_sets_torch_threads(tiny_model_dir, corpus, tmp_path, args, monkeypatch):
    import torch

    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)  # the process's own setting stays untouched
    args = [str(corpus) if a == "CORPUS" else str(tmp_path / a) if a.startswith("OUT") else a for a in args]
    r = invoke(*args, "--model", tiny_model_dir, "--threads", "1", *(["-q"] if args[0] != "similarity" else []))
    assert r.exit_code == 0, r.output
    assert seen == [1]
    args = [a + "2" if a.startswith(str(tmp_path / "OUT")) else a for a in args]
    r = invoke(*args, "--model", tiny_model_dir, "--threads", "0")
    one_line_error(r, "'--threads'", "greater than or equal to 1")
    assert seen == [1]


def test_model_dir_typo_is_one_line_no_such_folder(tmp_path, monkeypatch):
    """A mistyped local folder is not looked up on the Hub (which would answer with a network error)."""
    (tmp_path / "runs" / "my-flow").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for typo in ("my-flwo", "./my-flwo", "runs/my-flwo"):
        r = invoke("similarity", "a b", "c d", "--model-dir", typo)
        assert r.exit_code == 2 and r.stderr.startswith(f"bertflow: error: no such folder: {typo}"), r.stderr
        assert len(r.stderr.splitlines()) == 1 and "Hub" not in r.stderr
    assert "did you mean runs/my-flow?" in invoke("similarity", "a b", "c d", "--model-dir", "runs/my-flwo").stderr


def test_similarity_pairs_progress_bar_unless_quiet(tiny_model_dir, tmp_path):
    """Even a small file gets a bar with rate and ETA on stderr (stdout stays the TSV); -q turns it off."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\n" + f"{SENTENCES[0]}\t{SENTENCES[1]}\n", encoding="utf-8")
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir)
    assert r.exit_code == 0, r.output
    assert "similarity: 100%" in r.stderr and "2/2" in r.stderr and "similarity:" not in r.stdout
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q")
    assert r.exit_code == 0 and "similarity:" not in r.stderr


def test_similarity_pairs_from_stdin(tiny_model_dir, tmp_path):
    tsv = "score\tsentence1\tsentence2\n" + "".join(f"{i}\t{SENTENCES[i]}\t{SENTENCES[-1 - i]}\n" for i in range(5))
    proc = cli(
        "similarity", "--pairs", "-", "-o", "-", "--model", tiny_model_dir, "--device", "cpu", stdin=tsv.encode()
    )
    assert proc.returncode == 0, proc.stderr.decode()
    rows = proc.stdout.decode().splitlines()
    assert rows[0] == "cosine\tscore\tsentence1\tsentence2" and len(rows) == 6
