"""Tests of bertflow.evaluation.sts: cosine, correlations, the "all" vs "wmean" protocols and the report."""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bertflow.errors import InputError
from bertflow.evaluation import (
    StsReport,
    SubsetScore,
    TaskScore,
    correlations,
    cosine_scores,
    evaluate_pairs,
    evaluate_sts,
    evaluate_task,
)
from bertflow.evaluation.datasets import DATA_DIR_ENV, STS_TASKS, StsTask
from bertflow.io.text import SentencePairs

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sts_dir() -> Path:
    # The data is never copied into the repository: it lives next to the checkout (../shared/data/sts).
    env = os.environ.get(DATA_DIR_ENV)
    for candidate in ([Path(env)] if env else []) + [REPO_ROOT.parent / "shared" / "data" / "sts"]:
        if (candidate / "STS12").is_dir():
            return candidate
    pytest.skip(f"STS data not found at {REPO_ROOT.parent / 'shared/data/sts'} (set {DATA_DIR_ENV} to a copy)")


# ------------------------------------------------------------------------------------------------------
# cosine_scores / correlations
# ------------------------------------------------------------------------------------------------------


def test_cosine_scores_matches_manual_and_zero_vector() -> None:
    a = np.array([[1.0, 0.0, 0.0], [1.0, 2.0, 2.0], [0.0, 0.0, 0.0], [3.0, 4.0, 0.0], [1.0, 1.0, 0.0]])
    b = np.array([[0.0, 1.0, 0.0], [2.0, 4.0, 4.0], [1.0, 1.0, 1.0], [-3.0, -4.0, 0.0], [0.0, 0.0, 0.0]])
    manual = []
    for x, y in zip(a, b, strict=True):
        nx, ny = math.sqrt(sum(v * v for v in x)), math.sqrt(sum(v * v for v in y))
        manual.append(0.0 if nx == 0 or ny == 0 else sum(p * q for p, q in zip(x, y, strict=True)) / (nx * ny))
    out = cosine_scores(a, b)
    assert out.dtype == np.float64 and out.shape == (5,)
    np.testing.assert_allclose(out, manual, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(out[[0, 2, 4]], [0.0, 0.0, 0.0])
    assert out[1] == pytest.approx(1.0) and out[3] == pytest.approx(-1.0)


def test_cosine_scores_float64_computation_and_extreme_magnitudes() -> None:
    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((50, 16)).astype(np.float32)
    b32 = rng.standard_normal((50, 16)).astype(np.float32)
    a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
    expected = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    np.testing.assert_allclose(cosine_scores(a32, b32), expected, rtol=1e-13)
    # Norms beyond float64 range when squared must not overflow to inf/NaN.
    big = np.array([[1e200, 1e200]])
    np.testing.assert_allclose(cosine_scores(big, big * 1e-300), [1.0])
    np.testing.assert_allclose(cosine_scores(np.array([[1e-320, 0.0]]), np.array([[1.0, 1.0]])), [2**-0.5])


@pytest.mark.parametrize(
    ("a", "b", "pattern"),
    [
        (np.ones((3, 2)), np.ones((3, 4)), "same shape"),
        (np.ones(3), np.ones(3), "2-D"),
        (np.array([[1.0, np.nan]]), np.ones((1, 2)), "NaN"),
        (np.array([["x", "y"]]), np.ones((1, 2)), "numeric"),
    ],
)
def test_cosine_scores_rejects_bad_input(a: np.ndarray, b: np.ndarray, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        cosine_scores(a, b)


def test_correlations_scale_and_undefined_cases() -> None:
    gold = np.array([0.0, 1.0, 2.0, 3.5, 5.0])
    spearman, pearson = correlations(np.array([0.1, 0.2, 0.25, 0.3, 0.9]), gold)
    assert spearman == pytest.approx(100.0)
    assert pearson == pytest.approx(100 * stats.pearsonr([0.1, 0.2, 0.25, 0.3, 0.9], gold)[0])
    assert all(math.isnan(v) for v in correlations(np.full(5, 0.3), gold))  # constant encoder
    assert all(math.isnan(v) for v in correlations(np.array([0.3]), np.array([1.0])))
    with pytest.raises(InputError):
        correlations(np.ones(3), np.ones(4))


# ------------------------------------------------------------------------------------------------------
# Synthetic tasks with known answers
# ------------------------------------------------------------------------------------------------------


def _pairs_with_cosines(prefix: str, gold: list[float], cosines: list[float]) -> tuple[SentencePairs, dict]:
    """Pairs whose embeddings have exactly the given cosines: s1 -> e0, s2 -> (c, sqrt(1 - c^2))."""
    vectors: dict[str, np.ndarray] = {}
    s1, s2 = [], []
    for i, c in enumerate(cosines):
        a, b = f"{prefix}-{i}-a", f"{prefix}-{i}-b"
        vectors[a] = np.array([1.0, 0.0])
        vectors[b] = np.array([c, math.sqrt(1.0 - c * c)])
        s1.append(a)
        s2.append(b)
    return SentencePairs(s1, s2, np.array(gold, dtype=np.float64)), vectors


def _embed_from(vectors: dict[str, np.ndarray], calls: list[list[str]] | None = None):
    def embed(sentences: list[str]) -> np.ndarray:
        if calls is not None:
            calls.append(list(sentences))
        return np.stack([vectors[s] for s in sentences])

    return embed


def test_all_differs_from_wmean_hand_computed() -> None:
    # Subset A ranks perfectly (rho = 1); subset B has cosine ranks (2, 1, 3) vs gold (1, 2, 3):
    # rho = 1 - 6 * 2 / (3 * 8) = 0.5.
    # B's cosines sit on a higher scale than A's, which only the pooled "all" correlation punishes.
    pairs_a, vec_a = _pairs_with_cosines("A", [1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    pairs_b, vec_b = _pairs_with_cosines("B", [1, 2, 3], [0.6, 0.5, 0.7])
    result = evaluate_pairs("toy", {"A": pairs_a, "B": pairs_b}, _embed_from({**vec_a, **vec_b}))

    assert [(s.name, s.n_pairs) for s in result.subsets] == [("A", 4), ("B", 3)]
    assert result.subsets[0].spearman == pytest.approx(100.0)
    assert result.subsets[1].spearman == pytest.approx(50.0)
    assert result.wmean_spearman == pytest.approx((4 * 100 + 3 * 50) / 7)  # 78.57
    assert result.mean_spearman == pytest.approx(75.0)
    # Pooled: gold ranks (ties averaged) 1.5 3.5 5.5 7 1.5 3.5 5.5, cosine ranks 1 2 3 4 6 5 7;
    # their centred cross-product sum is 6, squared sums 26.5 and 28.
    assert result.all_spearman == pytest.approx(100 * 6 / math.sqrt(26.5 * 28))  # 22.03
    assert result.score("all") == result.all_spearman and result.score("wmean") == result.wmean_spearman

    # Pearson: same bookkeeping, computed from the definition.
    def pearson(x: list[float], y: list[float]) -> float:
        mx, my = sum(x) / len(x), sum(y) / len(y)
        sxy = sum((p - mx) * (q - my) for p, q in zip(x, y, strict=True))
        return 100 * sxy / math.sqrt(sum((p - mx) ** 2 for p in x) * sum((q - my) ** 2 for q in y))

    p_a = pearson([0.1, 0.2, 0.3, 0.4], [1, 2, 3, 4])
    p_b = pearson([0.6, 0.5, 0.7], [1, 2, 3])
    assert result.subsets[1].pearson == pytest.approx(p_b)
    assert result.wmean_pearson == pytest.approx((4 * p_a + 3 * p_b) / 7)
    assert result.all_pearson == pytest.approx(pearson([0.1, 0.2, 0.3, 0.4, 0.6, 0.5, 0.7], [1, 2, 3, 4, 1, 2, 3]))
    assert result.score("all", "pearson") == result.all_pearson


def test_perfect_embeddings_give_100_and_distinct_encoding() -> None:
    # One anchor sentence is the first sentence of every pair; cosine = a monotone function of gold.
    rng = np.random.default_rng(1)
    vectors = {"anchor": np.array([1.0, 0.0, 0.0])}
    subsets: dict[str, SentencePairs] = {}
    for name, n in (("small", 40), ("large", 120)):
        gold = rng.uniform(0, 5, size=n)
        s2 = []
        for i, g in enumerate(gold):
            c = np.tanh(g - 2.5) * 0.99  # strictly increasing in gold, inside (-1, 1)
            sentence = f"{name} {i}"
            vectors[sentence] = 7.0 * np.array([c, math.sqrt(1 - c * c), 0.0])  # scale must not matter
            s2.append(sentence)
        subsets[name] = SentencePairs(["anchor"] * n, s2, gold)
    task = StsTask("STS12", subsets, dict(subsets))
    calls: list[list[str]] = []
    result = evaluate_task(task, _embed_from(vectors, calls))

    assert len(calls) == 1 and calls[0] == task.eval_sentences()
    assert calls[0].count("anchor") == 1 and len(calls[0]) == 161
    for value in (result.all_spearman, result.wmean_spearman, *(s.spearman for s in result.subsets)):
        assert value == pytest.approx(100.0)
    assert result.all_pearson < 100.0  # tanh is monotone, not linear


def test_single_subset_all_equals_wmean_exactly() -> None:
    pairs, vectors = _pairs_with_cosines("t", [0.5, 1.0, 4.0, 2.0], [0.3, -0.2, 0.9, 0.5])
    result = evaluate_task(StsTask("STS-B", {"test": pairs}, {"test": pairs}), _embed_from(vectors))
    assert result.all_spearman == result.wmean_spearman == result.subsets[0].spearman
    assert result.all_pearson == result.wmean_pearson


def test_evaluate_task_rejects_bad_embeddings() -> None:
    pairs, vectors = _pairs_with_cosines("t", [1.0, 2.0, 3.0], [0.1, 0.2, 0.3])
    task = StsTask("STS-B", {"test": pairs}, {"test": pairs})
    with pytest.raises(InputError, match="5 rows for 6 sentences"):
        evaluate_task(task, lambda s: np.ones((len(s) - 1, 2)))
    with pytest.raises(InputError, match="NaN"):
        evaluate_task(task, lambda s: np.full((len(s), 2), np.nan))
    with pytest.raises(InputError, match="2-D"):
        evaluate_task(task, lambda s: np.ones(len(s)))


def test_evaluate_task_accepts_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    pairs, vectors = _pairs_with_cosines("t", [1.0, 2.0, 3.0], [0.1, 0.2, 0.3])
    task = StsTask("STS-B", {"test": pairs}, {"test": pairs})
    embed = _embed_from(vectors)
    result = evaluate_task(task, lambda s: torch.tensor(embed(s), dtype=torch.float32, requires_grad=True))
    assert result.all_spearman == pytest.approx(100.0)


# ------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------


def _task_score(name: str, all_s: float, wmean_s: float) -> TaskScore:
    return TaskScore(name, [SubsetScore("x", 10, wmean_s, 0.5)], all_s, all_s / 2, wmean_s, wmean_s / 2, wmean_s)


def test_report_average_dict_and_markdown() -> None:
    values = {name: (50.0 + i, 60.0 + 2 * i) for i, name in enumerate(STS_TASKS)}
    # Insert out of order: the table must still follow the papers' column order.
    report = StsReport({name: _task_score(name, *values[name]) for name in reversed(STS_TASKS)})
    assert report.average("all") == pytest.approx(53.0)
    assert report.average("wmean") == pytest.approx(66.0)
    assert report.average("all", "pearson") == pytest.approx(26.5)

    d = report.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text) == d
    assert list(d["tasks"]) == list(STS_TASKS)
    assert d["tasks"]["STS13"]["all"]["spearman"] == 51.0
    assert d["tasks"]["STS13"]["wmean"] == {"spearman": 62.0, "pearson": 31.0}
    assert d["tasks"]["STS13"]["subsets"] == [{"name": "x", "n_pairs": 10, "spearman": 62.0, "pearson": 0.5}]
    assert d["average"]["all"]["spearman"] == pytest.approx(53.0)

    lines = report.to_markdown().split("\n")
    assert lines[0] == "| protocol | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |"
    assert lines[1] == "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert lines[2] == "| all | 50.00 | 51.00 | 52.00 | 53.00 | 54.00 | 55.00 | 56.00 | 53.00 |"
    assert lines[3] == "| wmean | 60.00 | 62.00 | 64.00 | 66.00 | 68.00 | 70.00 | 72.00 | 66.00 |"
    assert len(lines) == 4


def test_report_nan_is_json_null_and_bad_protocol() -> None:
    report = StsReport({"STS-B": _task_score("STS-B", math.nan, 70.0)})
    d = report.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["tasks"]["STS-B"]["all"]["spearman"] is None
    assert "| all | nan | nan |" in report.to_markdown()
    with pytest.raises(InputError, match="protocol"):
        report.average("mean")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="no tasks"):
        StsReport({}).average()


# ------------------------------------------------------------------------------------------------------
# Real data
# ------------------------------------------------------------------------------------------------------


def _hashed_bow(sentences: list[str]) -> np.ndarray:
    """A cheap, deterministic bag-of-words encoder (crc32-hashed lowercase tokens, 256 dims)."""
    out = np.zeros((len(sentences), 256))
    for i, s in enumerate(sentences):
        for token in s.lower().split():
            out[i, zlib.crc32(token.encode("utf-8")) % 256] += 1.0
    return out


def test_evaluate_sts_on_real_data(sts_dir: Path) -> None:
    calls: list[int] = []

    def embed(sentences: list[str]) -> np.ndarray:
        assert len(set(sentences)) == len(sentences)  # each distinct sentence encoded once
        calls.append(len(sentences))
        return _hashed_bow(sentences)

    report = evaluate_sts(embed, data_dir=sts_dir)
    assert list(report.tasks) == list(STS_TASKS) and len(calls) == 7
    pairs = {name: t.n_pairs for name, t in report.tasks.items()}
    assert pairs == {
        "STS12": 3108,
        "STS13": 1500,
        "STS14": 3750,
        "STS15": 3000,
        "STS16": 1186,
        "STS-B": 1379,
        "SICK-R": 4927,
    }
    for name, t in report.tasks.items():
        # Word overlap correlates positively with similarity everywhere.
        assert 10.0 < t.all_spearman < 100.0 and 10.0 < t.wmean_spearman < 100.0, name
        if name in ("STS-B", "SICK-R"):
            assert t.all_spearman == t.wmean_spearman
        else:
            assert t.all_spearman != t.wmean_spearman and len(t.subsets) > 1

    # Independent check of the distinct-sentence bookkeeping: score STS-B test pair by pair.
    from bertflow.evaluation.datasets import load_sts_task

    test = load_sts_task("STS-B", sts_dir).eval_subsets["test"]
    # Same cosine function on per-pair embeddings: bag-of-words cosines tie a lot, and a different float
    # formula would break those ties differently, so the comparison must be exact, not approximate.
    cos = cosine_scores(_hashed_bow(test.sentences1), _hashed_bow(test.sentences2))
    assert report.tasks["STS-B"].all_spearman == 100 * stats.spearmanr(cos, test.scores)[0]
    assert report.to_markdown().count("\n") == 3


def test_evaluate_sts_per_task_embed_mapping(sts_dir: Path) -> None:
    seen: list[str] = []

    def make(name: str):
        def embed(sentences: list[str]) -> np.ndarray:
            seen.append(name)
            return _hashed_bow(sentences)

        return embed

    report = evaluate_sts({"STS-B": make("STS-B"), "SICK-R": make("SICK-R")}, ["sick", "stsb"], sts_dir)
    assert list(report.tasks) == ["SICK-R", "STS-B"] and seen == ["SICK-R", "STS-B"]
    with pytest.raises(InputError, match="no function for task"):
        evaluate_sts({"STS-B": make("STS-B")}, ["STS-B", "SICK-R"], sts_dir)
