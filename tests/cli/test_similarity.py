"""`bertflow similarity` end to end: sentence pairs, pairs files, raw and calibrated scores."""

from __future__ import annotations

import numpy as np

from bertflow import Embedder
from bertflow.calibrators import StandardNormCalibrator

from ..conftest import invoke
from .conftest import CORPUS


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
