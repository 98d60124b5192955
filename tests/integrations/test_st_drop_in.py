"""An Embedder where sentence-transformers code expects a SentenceTransformer (issue 25 item 4): its evaluators,
``util.paraphrase_mining``, ``encode_query`` / ``encode_document``, ``truncate_dim``, ``output_value``, a device
list, the dimension attributes, and ``Embedder("my-flow")``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from bertflow import Embedder, InputError, SentenceEncoder, WhiteningCalibrator
from bertflow.errors import ModelFileError

from ..conftest import SENTENCES

pytest.importorskip("sentence_transformers")
from sentence_transformers import util  # noqa: E402
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator  # noqa: E402

CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]


@pytest.fixture(scope="module")
def fitted(tiny_encoder) -> Embedder:
    return Embedder(tiny_encoder, WhiteningCalibrator(24)).fit(CORPUS)


def test_embedding_similarity_evaluator_runs_and_equals_our_spearman(fitted):
    s1, s2 = CORPUS[:20], CORPUS[20:40]
    scores = [float(i % 5) for i in range(20)]
    evaluator = EmbeddingSimilarityEvaluator(s1, s2, scores, name="toy")
    metrics = evaluator(fitted)
    ours = spearmanr(scores, fitted.similarity_pairwise(s1, s2).numpy()).statistic
    assert metrics["toy_spearman_cosine"] == pytest.approx(ours, abs=1e-6)
    assert evaluator.primary_metric == "toy_spearman_cosine"
    assert fitted.model_card_data.evaluations[-1]["evaluator"] == "EmbeddingSimilarityEvaluator"
    assert fitted.model_card_data.evaluations[-1]["metrics"]["toy_spearman_cosine"] == metrics["toy_spearman_cosine"]
    # truncated to 8 dimensions: the evaluator passes truncate_dim through encode
    short = EmbeddingSimilarityEvaluator(s1, s2, scores, name="short", truncate_dim=8)(fitted)
    z1, z2 = fitted.encode(s1)[:, :8], fitted.encode(s2)[:, :8]
    cos = (z1 * z2).sum(1) / np.linalg.norm(z1, axis=1) / np.linalg.norm(z2, axis=1)
    assert short["short_spearman_cosine"] == pytest.approx(spearmanr(scores, cos).statistic, abs=1e-6)


def test_paraphrase_mining_finds_the_most_similar_pairs(fitted):
    sentences = CORPUS[:16]
    pairs = util.paraphrase_mining(fitted, sentences, top_k=3)
    sims = fitted.similarity(sentences, sentences).numpy()
    best_score, i, j = pairs[0]
    np.fill_diagonal(sims, -np.inf)
    assert best_score == pytest.approx(sims.max(), abs=1e-5) and sims[i, j] == pytest.approx(best_score, abs=1e-5)
    assert all(a[0] >= b[0] for a, b in zip(pairs, pairs[1:], strict=False))


def test_query_document_truncate_dim_and_dimensions(fitted):
    z = fitted.encode(SENTENCES)
    np.testing.assert_array_equal(fitted.encode_query(SENTENCES), z)
    np.testing.assert_array_equal(fitted.encode_document(SENTENCES, convert_to_tensor=True).numpy(), z)
    assert fitted.get_sentence_embedding_dimension() == fitted.get_embedding_dimension() == 24
    assert fitted.similarity_fn_name == "cosine" and fitted.device == torch.device("cpu")
    fitted.similarity_fn_name = "cosine"
    with pytest.raises(InputError, match="cosine only, not 'dot'"):
        fitted.similarity_fn_name = "dot"
    np.testing.assert_array_equal(fitted.encode(SENTENCES, truncate_dim=5), z[:, :5])
    unit = fitted.encode(SENTENCES, truncate_dim=5, normalize_embeddings=True)  # normalised after truncating
    np.testing.assert_allclose(unit, z[:, :5] / np.linalg.norm(z[:, :5], axis=1, keepdims=True), atol=1e-6)
    assert fitted.encode("The cat sleeps.", truncate_dim=3).shape == (3,)
    short = Embedder(fitted.encoder, fitted.calibrator, truncate_dim=10)
    assert short.encode(SENTENCES).shape == (len(SENTENCES), 10) and short.get_sentence_embedding_dimension() == 10
    for bad in (0, 25, 2.5, True):
        with pytest.raises(InputError, match=r"truncate_dim must be None or an integer in \[1, 24\]"):
            fitted.encode(SENTENCES, truncate_dim=bad)


def test_output_value_is_the_sentence_embedding_only(fitted):
    np.testing.assert_array_equal(fitted.encode(SENTENCES, output_value="sentence_embedding"), fitted.encode(SENTENCES))
    for bad in ("token_embeddings", None):
        with pytest.raises(InputError, match="sentence embeddings only"):
            fitted.encode(SENTENCES, output_value=bad)


@pytest.mark.slow
def test_a_device_list_encodes_in_processes_like_one_call(fitted):
    want = fitted.encode(CORPUS)
    got = fitted.encode(CORPUS, device=["cpu", "cpu"], batch_size=8)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # other batches, host-side calibration
    with pytest.raises(InputError, match="names no device"):
        fitted.encode(CORPUS, device=[])
    with pytest.raises(InputError, match="'gpu0' is not a torch device"):
        fitted.encode(CORPUS, device=["cpu", "gpu0"])


def test_embedder_of_a_path_loads_it_or_refuses_at_once(fitted, tmp_path, tiny_model_dir):
    fitted.save(tmp_path / "my-flow")
    loaded = Embedder(str(tmp_path / "my-flow"))
    np.testing.assert_array_equal(loaded.encode(SENTENCES), fitted.encode(SENTENCES))
    assert loaded.source == str((tmp_path / "my-flow").resolve()) and loaded.fit_info == fitted.fit_info
    with pytest.raises(ModelFileError) as e:
        Embedder(tmp_path / "missing")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelFileError):
        Embedder(str(tiny_model_dir))  # an encoder folder, not a saved bertflow model
    with pytest.raises(InputError, match="ambiguous"):
        Embedder(str(tmp_path / "my-flow"), WhiteningCalibrator())
    with pytest.raises(InputError, match="takes a SentenceEncoder"):
        Embedder(42)
    assert isinstance(loaded.encoder, SentenceEncoder)
