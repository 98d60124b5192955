"""One encoding path: what ``bertflow evaluate`` scores is what ``Embedder.encode`` gives (CPU, float32)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator
from bertflow.evaluation.cache import EmbeddingCache, embed_cached
from bertflow.evaluation.datasets import load_nli_sentences, load_sts_task
from bertflow.evaluation.sts import evaluate_task

from ..sts_layout import _invoke, layout, one_torch_thread, working_tiny_bert  # noqa: F401 - fixtures

TASKS = ("STS-B", "STS12")


def test_evaluate_model_dir_scores_what_embedder_encode_gives(
    working_tiny_bert: Path,  # noqa: F811
    layout: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    encoder = SentenceEncoder(str(working_tiny_bert), device="cpu")
    Embedder(encoder, WhiteningCalibrator()).fit(load_nli_sentences(layout)[:200]).save(tmp_path / "m")
    r = _invoke(
        "evaluate", "--model-dir", tmp_path / "m", "--tasks", ",".join(TASKS), "--data-dir", layout,
        "--no-cache", "-o", tmp_path / "ev", "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    cell = json.loads((tmp_path / "ev" / "evaluate.json").read_text())["cells"][1]
    assert cell["calibrator"] == "whitening"
    loaded = Embedder.load(tmp_path / "m")
    for name in TASKS:
        mine = evaluate_task(load_sts_task(name, layout), loaded.encode)  # the product path, calibrated on device
        got = cell["tasks"][name]
        pairs = [
            (got["all"]["mean"], mine.all_spearman),
            (got["wmean"]["mean"], mine.wmean_spearman),
            (got["pearson"]["all"]["mean"], mine.all_pearson),
            (got["pearson"]["wmean"]["mean"], mine.wmean_pearson),
        ]
        # Scores are correlations x 100. The same raw vectors from the same forward pass; what remains is the
        # calibrator's float rounding (evaluate applies it to the cached raw rows), far below 1e-6 of a correlation.
        for reported, direct in pairs:
            assert abs(reported - direct) / 100 <= 1e-6, (name, reported, direct)


def test_cached_vectors_are_the_encoders_vectors(
    working_tiny_bert: Path,  # noqa: F811
    layout: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    encoder = SentenceEncoder(str(working_tiny_bert), device="cpu")
    sentences = list(dict.fromkeys(load_sts_task("STS-B", layout).eval_sentences()))
    cache = EmbeddingCache(tmp_path / "cache")
    for _ in range(2):  # encoded, then read back from disk
        cached = embed_cached(encoder, sentences, ["mean", "cls"], cache=cache)
        np.testing.assert_array_equal(cached["mean"], encoder.encode(sentences))
        cls = SentenceEncoder(str(working_tiny_bert), pooling="cls", device="cpu")
        np.testing.assert_array_equal(cached["cls"], cls.encode(sentences))
