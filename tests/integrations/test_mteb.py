"""MTEB on bertflow models: mteb.evaluate on an Embedder (through MTEBEncoder, or its SentenceTransformer)
over a local STS task built from the STS-B files, scored against bertflow's own STS evaluation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mteb")

import mteb  # noqa: E402
from mteb.models import EncoderProtocol  # noqa: E402

from bertflow import Embedder, FlowCalibrator, InputError, NotFittedError, WhiteningCalibrator  # noqa: E402
from bertflow.evaluation.datasets import load_sts_task  # noqa: E402
from bertflow.evaluation.sts import evaluate_pairs  # noqa: E402
from bertflow.integrations.mteb import MTEBEncoder, sts_task  # noqa: E402
from bertflow.integrations.st_export import from_embedder  # noqa: E402
from bertflow.io.text import SentencePairs  # noqa: E402

N_PAIRS = 200


@pytest.fixture(scope="module")
def stsb_pairs(data_dir) -> SentencePairs:
    """The first 200 pairs of the STS-B test split, read from the local TSV."""
    test = load_sts_task("STSB", data_dir).eval_subsets["test"]
    return SentencePairs(test.sentences1[:N_PAIRS], test.sentences2[:N_PAIRS], test.scores[:N_PAIRS])


@pytest.fixture(scope="module")
def embedder(default_encoder, stsb_pairs) -> Embedder:
    """all-MiniLM-L6-v2 + whitening-64 fitted (no labels) on the pairs' own sentences (BERT-flow's target regime)."""
    return Embedder(default_encoder, WhiteningCalibrator(64)).fit(list(dict.fromkeys(stsb_pairs.sentences())))


def run(model, task) -> dict:
    result = mteb.evaluate(model, [task], cache=None, show_progress_bar=False, co2_tracker=False)
    (task_result,) = result.task_results
    (scores,) = task_result.scores["test"]
    return scores


def test_mteb_main_score_equals_bertflow_spearman(embedder, stsb_pairs):
    """MTEB's main score (cosine Spearman, in [0, 1]) is bertflow's Spearman / 100 on the same pairs: the same
    embeddings, the same cosine, the same rank correlation. MTEB rescales the gold scores to [0, 1] and computes the
    cosine in float32, which changes no rank here; Pearson moves by float32 rounding only."""
    scores = run(MTEBEncoder(embedder), sts_task("STSB-local-200", stsb_pairs))
    ours = evaluate_pairs("STSB-local-200", {"test": stsb_pairs}, embedder.encode)
    assert scores["main_score"] == scores["cosine_spearman"] == pytest.approx(ours.all_spearman / 100, abs=1e-6)
    assert scores["spearman"] == pytest.approx(scores["cosine_spearman"], abs=1e-9)  # the model's own similarity
    assert scores["cosine_pearson"] == pytest.approx(ours.all_pearson / 100, abs=1e-6)
    assert 0.5 < scores["main_score"] < 1.0  # a real STS score, not a degenerate one


def test_mteb_runs_the_sentence_transformer_conversion(embedder, stsb_pairs):
    """MTEB's native sentence-transformers route on the converted model gives the same score, up to the two
    libraries' pooling rounding (about 1e-7 in cosine, which may swap near-tied ranks)."""
    pytest.importorskip("sentence_transformers")
    scores = run(from_embedder(embedder), sts_task("STSB-local-200", stsb_pairs))
    ours = evaluate_pairs("STSB-local-200", {"test": stsb_pairs}, embedder.encode)
    assert scores["main_score"] == pytest.approx(ours.all_spearman / 100, abs=1e-3)


def test_encoder_protocol_and_model_meta(embedder, default_encoder, stsb_pairs):
    adapter = MTEBEncoder(embedder)
    assert isinstance(adapter, EncoderProtocol)
    meta = adapter.mteb_model_meta
    assert meta.name == "bertflow/all-MiniLM-L6-v2-whitening" and meta.embed_dim == 64
    assert str(getattr(meta.similarity_fn_name, "value", meta.similarity_fn_name)) == "cosine"  # an enum in mteb 2
    assert meta.max_tokens == 64 and meta.use_instructions is False
    assert MTEBEncoder(embedder).mteb_model_meta.revision == meta.revision
    assert MTEBEncoder(embedder, name="me/my-flow").mteb_model_meta.name == "me/my-flow"
    # The revision is the model's identity, so MTEB's result cache cannot serve one fit's scores for another's.
    other = Embedder(default_encoder, WhiteningCalibrator(64)).fit(list(stsb_pairs.sentences1))
    other_meta = MTEBEncoder(other).mteb_model_meta
    assert other_meta.name == meta.name and other_meta.revision != meta.revision

    z = embedder.encode(stsb_pairs.sentences1[:5])
    w = embedder.encode(stsb_pairs.sentences2[:5])
    expected = embedder.similarity(stsb_pairs.sentences1[:5], stsb_pairs.sentences2[:5])
    for model in (adapter, embedder):  # on embeddings, both answer as SentenceTransformer.similarity does
        sims = model.similarity(z, torch.from_numpy(w))
        assert isinstance(sims, torch.Tensor) and sims.shape == (5, 5)
        np.testing.assert_allclose(sims.numpy(), expected, atol=1e-6)
        np.testing.assert_allclose(model.similarity_pairwise(z, w).numpy(), np.diag(expected), atol=1e-6)


def test_mteb_encode_kwargs_reach_embedder_encode(embedder, stsb_pairs):
    """MTEB's encode_kwargs go to Embedder.encode: a known one works, an unknown one is a TypeError naming it."""
    head = SentencePairs(stsb_pairs.sentences1[:20], stsb_pairs.sentences2[:20], stsb_pairs.scores[:20])
    task = sts_task("STSB-local-20", head)
    common = {"cache": None, "show_progress_bar": False, "co2_tracker": False}
    scores = mteb.evaluate(MTEBEncoder(embedder), [task], encode_kwargs={"batch_size": 3}, **common)
    assert scores.task_results[0].scores["test"][0]["main_score"] > 0
    with pytest.raises(TypeError, match="'colour'"):
        mteb.evaluate(MTEBEncoder(embedder), [task], encode_kwargs={"colour": "red"}, **common)


def test_adapter_refusals(default_encoder, embedder, stsb_pairs):
    unfitted = Embedder(default_encoder, FlowCalibrator())
    with pytest.raises(NotFittedError):
        MTEBEncoder(unfitted)
    with pytest.raises(InputError, match="wraps a bertflow Embedder"):
        MTEBEncoder("all-MiniLM-L6-v2")
    with pytest.raises(InputError, match="text only"):
        MTEBEncoder(embedder).encode([{"image": [1]}])
    with pytest.raises(InputError, match="one shape"):
        MTEBEncoder(embedder).similarity_pairwise(np.ones((2, 3)), np.ones((3, 3)))


def test_sts_task_from_local_pairs(stsb_pairs):
    task = sts_task("mine", {"dev": stsb_pairs}, min_score=0, max_score=5)
    assert task.data_loaded and task.metadata.eval_splits == ["dev"] and task.metadata.main_score == "cosine_spearman"
    assert task.dataset["dev"]["sentence1"][0] == stsb_pairs.sentences1[0]
    # The dataset revision is a hash of the pairs and scores: other data, another revision.
    changed = SentencePairs(stsb_pairs.sentences1, stsb_pairs.sentences2, stsb_pairs.scores + 0.5)
    assert sts_task("mine", {"dev": changed}).metadata.dataset["revision"] != task.metadata.dataset["revision"]
    with pytest.raises(InputError, match="no gold scores"):
        sts_task("nli", SentencePairs(["a"], ["b"], labels=["entailment"]))
    with pytest.raises(InputError, match="no pairs"):
        sts_task("empty", SentencePairs([], [], np.zeros(0)))


DOCS = Path(__file__).resolve().parents[2] / "docs" / "ecosystem.md"


def docs_block(containing: str) -> str:
    """The one Python code block of docs/ecosystem.md that contains ``containing``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


def test_docs_local_mteb_snippet_runs_as_written(embedder, stsb_pairs, tmp_path, monkeypatch):
    """The docs' local-task snippet, run verbatim in a folder holding 'my-flow' and 'my-pairs.tsv'."""
    monkeypatch.chdir(tmp_path)
    embedder.save("my-flow")
    head = SentencePairs(stsb_pairs.sentences1[:40], stsb_pairs.sentences2[:40], stsb_pairs.scores[:40])
    rows = [f"{score:.3f}\t{a}\t{b}" for score, a, b in zip(head.scores, head.sentences1, head.sentences2, strict=True)]
    (tmp_path / "my-pairs.tsv").write_text("score\tsentence1\tsentence2\n" + "\n".join(rows) + "\n", encoding="utf-8")
    namespace: dict = {}
    exec(docs_block("sts_task("), namespace)
    ours = evaluate_pairs("my-sts", {"test": head}, embedder.encode)
    assert namespace["results"].task_results[0].get_score() == pytest.approx(ours.all_spearman / 100, abs=1e-6)


def test_docs_sentence_transformers_snippets_run_as_written(embedder, tmp_path, monkeypatch):
    """The docs' from_embedder and encode-keyword snippets, run verbatim."""
    pytest.importorskip("sentence_transformers")
    monkeypatch.chdir(tmp_path)
    embedder.save("my-flow")
    namespace: dict = {}
    exec(docs_block('st.save("my-flow-st")'), namespace)
    assert (tmp_path / "my-flow-st" / "modules.json").is_file()
    np.testing.assert_allclose(
        namespace["st"].encode(["A man is playing a guitar."]),
        embedder.encode(["A man is playing a guitar."]),
        atol=1e-4,
    )
    namespace = {"model": embedder, "sentences": ["A man is playing a guitar.", "The cat sleeps.", "A dog runs."]}
    exec(docs_block("convert_to_tensor=True"), namespace)
    assert namespace["z"].shape == (3, 64)
