"""The measures of ``bertflow analyze`` (:mod:`bertflow.paper.analyze`), drawn by :mod:`bertflow.paper.plots`: word
edit distance, anisotropy of embeddings (taken on L2-normalised rows: cosine ignores norms, and the raw and calibrated
spaces have different scales) and the paper's Table 6 (similarity against edit distance and against gold)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from ..errors import InputError
from ..linalg import unit_rows

#: The paper's "small edit distance" cut-off: pairs whose word-level Levenshtein distance is at most this.
SMALL_EDIT_DISTANCE = 4

_TOKEN = re.compile(r"\w+|[^\w\s]")


def word_tokens(sentence: str) -> list[str]:
    """Lowercased word and punctuation tokens (``\\w+`` runs and single other non-space characters)."""
    return _TOKEN.findall(sentence.lower())


def levenshtein(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two token sequences (insertions, deletions, substitutions cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def edit_distances(sentences1: Sequence[str], sentences2: Sequence[str]) -> np.ndarray:
    """Word-level Levenshtein distance of each pair: int64 [N]."""
    pairs = zip(sentences1, sentences2, strict=True)
    return np.array([levenshtein(word_tokens(a), word_tokens(b)) for a, b in pairs], dtype=np.int64)


def mean_pairwise_cosine(x: np.ndarray) -> float:
    """Mean cosine over all pairs i != j of the rows of ``x`` [N, D], exactly in O(N D): for unit rows u_i,
    sum_{i != j} u_i . u_j = ||sum_i u_i||^2 - N."""
    u = unit_rows(x)
    n = len(u)
    if n < 2:
        raise InputError("mean pairwise cosine needs at least 2 rows")
    return (float(np.square(u.sum(axis=0)).sum()) - float(np.square(u).sum())) / (n * (n - 1))


def isotropy_score(x: np.ndarray) -> float:
    """Partition-function isotropy I(X) = min_c Z(c) / max_c Z(c), Z(c) = sum_i exp(c . u_i) (Mu & Viswanath 2018),
    in (0, 1]: 1 is isotropic, near 0 the rows share a direction.

    c ranges over the eigenvectors of U^T U and their negatives; U holds the L2-normalised rows of ``x`` [N, D].
    Computed in log space, so it cannot overflow.
    """
    u = unit_rows(x)
    _, vecs = np.linalg.eigh(u.T @ u)
    proj = u @ vecs  # [N, D]: c . u_i for every eigenvector c
    log_z = np.concatenate([logsumexp(proj, axis=0), logsumexp(-proj, axis=0)])
    return float(math.exp(log_z.min() - log_z.max()))


def spectrum(x: np.ndarray) -> np.ndarray:
    """Eigenvalues of U^T U / N for the L2-normalised rows U of ``x`` [N, D], descending, summing to 1: float64
    [min(N, D)]. The top one is (about) the share of the common direction; a flat spectrum means isotropy."""
    u = unit_rows(x)
    return np.linalg.svd(u, compute_uv=False) ** 2 / len(u)


def geometry(x: np.ndarray) -> dict[str, Any]:
    """Anisotropy measures of embeddings [N, D]; JSON-ready."""
    eig = spectrum(x)
    p = eig / eig.sum()
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    return {
        "n": int(len(x)),
        "dim": int(x.shape[1]),
        "mean_pairwise_cosine": mean_pairwise_cosine(x),
        "isotropy_score": isotropy_score(x),
        "top_eigenvalue_share": float(p[0]),
        "top10_eigenvalue_share": float(p[:10].sum()),
        "effective_rank": math.exp(entropy),
        "eigenvalues": [float(v) for v in eig],
    }


def spearman_x100(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman correlation x 100 of ``a`` and ``b`` [N], or ``None`` when undefined (N < 3 or a constant input)."""
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(stats.spearmanr(a, b)[0]) * 100.0


def lexical_table(
    gold: np.ndarray, similarities: Mapping[str, np.ndarray], distance: np.ndarray, small: int = SMALL_EDIT_DISTANCE
) -> dict[str, Any]:
    """The paper's Table 6: Spearman x 100 of gold and of each similarity (``{"raw": cos [N], ...}``) against edit
    distance ``distance`` [N] and against ``gold`` [N], on all pairs and on those with ``distance <= small``:
    ``{"all": {"n": N, "rows": {name: {"vs_edit_distance", "vs_gold"}}}, "small": {...}}``, ``"gold"`` first among
    the rows; an undefined correlation is ``None``."""
    out: dict[str, Any] = {}
    for part, mask in (("all", np.ones(len(gold), dtype=bool)), ("small", distance <= small)):
        rows = {"gold": {"vs_edit_distance": spearman_x100(gold[mask], distance[mask]), "vs_gold": 100.0}}
        for name, sim in similarities.items():
            rows[name] = {
                "vs_edit_distance": spearman_x100(sim[mask], distance[mask]),
                "vs_gold": spearman_x100(sim[mask], gold[mask]),
            }
        out[part] = {"n": int(mask.sum()), "rows": rows}
    out["small"]["max_edit_distance"] = small
    return out
