"""The measures of `bertflow analyze` (bertflow.paper.measures): word edit distance, anisotropy, Table 6."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from bertflow.errors import InputError
from bertflow.paper.measures import (
    edit_distances,
    geometry,
    isotropy_score,
    levenshtein,
    lexical_table,
    mean_pairwise_cosine,
    spectrum,
    word_tokens,
)


def test_word_level_levenshtein() -> None:
    assert word_tokens("A man's guitar, played!") == ["a", "man", "'", "s", "guitar", ",", "played", "!"]
    assert levenshtein([], []) == 0 and levenshtein(["a"], []) == 1
    assert levenshtein("kitten".split(), "kitten".split()) == 0
    assert levenshtein(list("kitten"), list("sitting")) == 3  # the classic, on characters as tokens
    assert levenshtein(["a", "b", "c"], ["c", "b", "a"]) == 2
    d = edit_distances(["A man plays a guitar.", "The cat sleeps."], ["A woman plays a guitar.", "the CAT sleeps ."])
    assert d.tolist() == [1, 0] and d.dtype == np.int64


def test_mean_pairwise_cosine_equals_brute_force() -> None:
    x = np.random.default_rng(0).normal(size=(40, 6)) + 0.5
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    brute = np.mean([u[i] @ u[j] for i, j in itertools.permutations(range(40), 2)])
    assert mean_pairwise_cosine(x) == pytest.approx(brute, abs=1e-12)
    assert mean_pairwise_cosine(x * np.arange(1, 41)[:, None]) == pytest.approx(brute, abs=1e-12)  # norm-free
    with pytest.raises(InputError):
        mean_pairwise_cosine(x[:1])


def test_isotropy_score_and_spectrum() -> None:
    rng = np.random.default_rng(0)
    iso = rng.normal(size=(4000, 8))
    cone = iso + 4.0  # every vector near the direction (1, ..., 1)
    assert isotropy_score(iso) > 0.9
    assert isotropy_score(cone) < 0.5 * isotropy_score(iso)
    # Brute force on a small set: Z(c) over the eigenvectors and their negatives.
    x = rng.normal(size=(30, 3)) + 1.0
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    _, vecs = np.linalg.eigh(u.T @ u)
    z = [np.exp(u @ (s * c)).sum() for c in vecs.T for s in (1, -1)]
    assert isotropy_score(x) == pytest.approx(min(z) / max(z), rel=1e-10)
    assert isotropy_score(x * 1e3) == pytest.approx(isotropy_score(x), rel=1e-10)  # rows are normalised
    eig = spectrum(cone)
    assert eig.sum() == pytest.approx(1.0) and np.all(np.diff(eig) <= 1e-12) and eig[0] > 0.8
    g = geometry(iso)
    assert g["effective_rank"] > 7.5 and abs(g["mean_pairwise_cosine"]) < 0.01 and len(g["eigenvalues"]) == 8


def test_lexical_table_hand_computed() -> None:
    gold = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    distance = np.array([0, 1, 2, 3, 5, 9])
    lexical = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])  # ranks exactly by edit distance
    table = lexical_table(gold, {"raw": lexical, "flat": np.ones(6)}, distance)
    assert table["all"]["n"] == 6 and table["small"]["n"] == 4 and table["small"]["max_edit_distance"] == 4
    assert table["all"]["rows"]["gold"]["vs_edit_distance"] == pytest.approx(-100.0)
    assert table["all"]["rows"]["raw"]["vs_gold"] == pytest.approx(100.0)
    assert table["all"]["rows"]["flat"]["vs_gold"] is None  # constant: undefined, not NaN
    rng = np.random.default_rng(1)
    g, d, s = rng.normal(size=50), rng.integers(0, 9, size=50), rng.normal(size=50)
    t = lexical_table(g, {"x": s}, d)
    small = d <= 4
    assert t["small"]["rows"]["x"]["vs_edit_distance"] == pytest.approx(100 * stats.spearmanr(s[small], d[small])[0])
