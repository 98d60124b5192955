"""STS evaluation: Spearman (and Pearson) x 100 of the cosine similarity of each pair's two embeddings against the
gold score, under both conventions for tasks of several subsets (:data:`PROTOCOL_TEXT`; ``"wmean"`` is SentEval's);
for single-subset tasks (STS-B and SICK-R) both are the same number."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy import stats

from bertflow.errors import InputError
from bertflow.evaluation.datasets import STS_TASKS, StsTask, load_sts_tasks
from bertflow.io.text import SentencePairs
from bertflow.linalg import unit_rows
from bertflow.validation import check_array

logger = logging.getLogger(__name__)

Protocol = Literal["all", "wmean"]
Metric = Literal["spearman", "pearson"]
EmbedFn = Callable[[list[str]], Any]
"""Maps a list of N sentences to an (N, D) array of embeddings (numpy, or anything ``np.asarray`` accepts)."""
#: What each protocol means, as reports state it.
PROTOCOL_TEXT = {
    "all": "one correlation over all subsets of a task concatenated (SBERT, SimCSE, MTEB)",
    "wmean": "subset-size-weighted mean of per-subset correlations (BERT-flow and whitening papers)",
}


def _as_2d_float(x: Any, name: str) -> np.ndarray:
    """Convert embeddings to a finite float64 (N, D) array; accepts numpy arrays and CPU torch tensors."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        # torch tensors: avoid importing torch here; detach so tensors that require grad convert too.
        x = x.detach().cpu().numpy()
    return check_array(x, what=name, min_rows=0, max_magnitude=None)  # cosine is scale-invariant: any size


def cosine_scores(emb1: np.ndarray, emb2: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two embedding matrices (N, D): float64 (N,) in [-1, 1], computed in float64
    whatever the input dtype. A pair involving a zero vector gets cosine 0 (no direction, hence no similarity)
    instead of NaN. InputError for shapes that differ or are not 2-D, or NaN/inf."""
    a, b = _as_2d_float(emb1, "the embeddings emb1"), _as_2d_float(emb2, "the embeddings emb2")
    if a.shape != b.shape:
        raise InputError(f"emb1 and emb2 must have the same shape, got {a.shape} and {b.shape}")
    return np.clip(np.einsum("nd,nd->n", unit_rows(a), unit_rows(b)), -1.0, 1.0)


def correlations(predicted: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """``(spearman, pearson)`` correlation x 100, each in [-100, 100], between predicted similarities (N,) and gold
    scores (N,); NaN when undefined (fewer than 2 pairs or a constant input, e.g. an encoder that maps every sentence
    to the same vector), logged as a warning."""
    p, g = (np.asarray(v, dtype=np.float64).ravel() for v in (predicted, gold))
    if p.shape != g.shape:
        raise InputError(f"predicted has {p.size} values but gold has {g.size}")
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(g) == 0:
        logger.warning("correlation undefined (%d pairs, constant input); reporting NaN", p.size)
        return math.nan, math.nan
    return float(stats.spearmanr(p, g)[0]) * 100.0, float(stats.pearsonr(p, g)[0]) * 100.0


@dataclass
class SubsetScore:
    """Correlations on one subset (or split) of a task (``"MSRpar"``, ``"test"``): ``n_pairs`` scored pairs, and the
    Spearman and Pearson x 100 of cosine vs gold."""

    name: str
    n_pairs: int
    spearman: float
    pearson: float


@dataclass
class TaskScore:
    """Correlations (x 100) of one ``task`` (``"STS12"``): per subset (in the task's order) and over all subsets
    concatenated (``all_*``, "all"), their size-weighted mean (``wmean_*``, "wmean") and unweighted mean
    (``mean_spearman``, SentEval's "mean", for reference)."""

    task: str
    subsets: list[SubsetScore]
    all_spearman: float
    all_pearson: float
    wmean_spearman: float
    wmean_pearson: float
    mean_spearman: float

    @property
    def n_pairs(self) -> int:
        """Total number of evaluation pairs."""
        return sum(s.n_pairs for s in self.subsets)

    def score(self, protocol: Protocol = "all", metric: Metric = "spearman") -> float:
        """The task's headline number under ``protocol`` ("all" or "wmean") for ``metric``."""
        if protocol not in ("all", "wmean") or metric not in ("spearman", "pearson"):
            raise InputError(
                f"protocol must be 'all' or 'wmean', metric 'spearman' or 'pearson': got {protocol!r}, {metric!r}"
            )
        return float(getattr(self, f"{protocol}_{metric}"))


def _nan_to_none(x: float) -> float | None:
    # JSON has no NaN; None (null) keeps the output parseable by strict JSON readers.
    return None if math.isnan(x) else float(x)


def _pair(spearman: float, pearson: float) -> dict[str, float | None]:
    return {"spearman": _nan_to_none(spearman), "pearson": _nan_to_none(pearson)}


@dataclass
class StsReport:
    """Scores of several STS tasks, keyed by task name in evaluation order."""

    tasks: dict[str, TaskScore]

    def _ordered(self) -> list[str]:
        known = [t for t in STS_TASKS if t in self.tasks]
        return known + [t for t in self.tasks if t not in known]

    def average(self, protocol: Protocol = "all", metric: Metric = "spearman") -> float:
        """Plain (unweighted) mean over the evaluated tasks, as the papers' "Avg." column; NaN if any task is NaN."""
        if not self.tasks:
            raise InputError("the report has no tasks")
        return float(np.mean([t.score(protocol, metric) for t in self.tasks.values()]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict: per task its subsets and both protocols, plus the averages; undefined
        correlations (NaN) become None."""
        out_tasks: dict[str, Any] = {}
        for name in self._ordered():
            t = self.tasks[name]
            out_tasks[name] = {
                "n_pairs": t.n_pairs,
                "all": _pair(t.all_spearman, t.all_pearson),
                "wmean": _pair(t.wmean_spearman, t.wmean_pearson),
                "mean": {"spearman": _nan_to_none(t.mean_spearman)},
                "subsets": [{"name": s.name, "n_pairs": s.n_pairs, **_pair(s.spearman, s.pearson)} for s in t.subsets],
            }
        protocols = ("all", "wmean") if self.tasks else ()
        average = {p: _pair(self.average(p, "spearman"), self.average(p, "pearson")) for p in protocols}  # type: ignore[arg-type]
        return {
            "metric": "correlation x 100 between cosine similarity and gold score",
            "protocols": dict(PROTOCOL_TEXT),
            "tasks": out_tasks,
            "average": average,
        }

    def to_markdown(self, metric: Metric = "spearman", digits: int = 2) -> str:
        """Markdown table of ``metric`` with ``digits`` decimals, without a trailing newline: one row per protocol
        (all, wmean), one column per task, then "Avg."."""
        names = self._ordered()
        lines = ["| protocol | " + " | ".join(names) + " | Avg. |", "|---|" + "---:|" * (len(names) + 1)]
        for protocol in ("all", "wmean"):
            cells = [f"{self.tasks[n].score(protocol, metric):.{digits}f}" for n in names]  # type: ignore[arg-type]
            avg = f"{self.average(protocol, metric):.{digits}f}" if names else ""  # type: ignore[arg-type]
            lines.append(f"| {protocol} | " + " | ".join(cells) + f" | {avg} |")
        return "\n".join(lines)


def evaluate_pairs(name: str, subsets: Mapping[str, SentencePairs], embed: EmbedFn) -> TaskScore:
    """Score scored pair sets as one task named ``name`` (an STS task's subsets, or a user's own STS-style files):
    per-subset and aggregated ("all", "wmean") correlations x 100. ``embed`` maps a list of N sentences to an (N, D)
    array, row i for sentence i; it is called once, with the distinct sentences. InputError for no subset, a subset
    without gold scores, or ``embed`` returning the wrong number of rows, a non-2-D array or NaN/inf values."""
    distinct = list(dict.fromkeys(s for pairs in subsets.values() for s in pairs.sentences()))
    emb = _as_2d_float(embed(distinct), f"the embeddings returned for {name}")
    if emb.shape[0] != len(distinct):
        raise InputError(
            f"embed returned {emb.shape[0]} rows for {len(distinct)} sentences ({name}); it must return "
            "one row per input sentence, in order"
        )
    index = {s: i for i, s in enumerate(distinct)}
    scores: list[SubsetScore] = []
    all_cos: list[np.ndarray] = []
    for subset, pairs in subsets.items():
        if pairs.scores is None:
            raise InputError(f"{name}/{subset} has no gold scores")
        i1, i2 = ([index[s] for s in side] for side in (pairs.sentences1, pairs.sentences2))
        all_cos.append(cosine_scores(emb[i1], emb[i2]))
        scores.append(SubsetScore(subset, len(pairs), *correlations(all_cos[-1], pairs.scores)))
    if not scores:
        raise InputError(f"{name} has no evaluation subsets")
    if len(scores) == 1:  # identical by definition: copied, so that all == wmean exactly
        all_spearman, all_pearson = scores[0].spearman, scores[0].pearson
    else:
        gold = np.concatenate([pairs.scores for pairs in subsets.values()])  # type: ignore[misc]
        all_spearman, all_pearson = correlations(np.concatenate(all_cos), gold)
    sizes = [s.n_pairs for s in scores]
    return TaskScore(
        task=name,
        subsets=scores,
        all_spearman=all_spearman,
        all_pearson=all_pearson,
        wmean_spearman=float(np.average([s.spearman for s in scores], weights=sizes)),
        wmean_pearson=float(np.average([s.pearson for s in scores], weights=sizes)),
        mean_spearman=float(np.mean([s.spearman for s in scores])),
    )


def evaluate_task(task: StsTask, embed: EmbedFn) -> TaskScore:
    """Evaluate one STS task with cosine similarity (:func:`evaluate_pairs` over its evaluation subsets): ``embed``
    is called once, with the task's distinct evaluation sentences (:meth:`StsTask.eval_sentences`)."""
    return evaluate_pairs(task.name, task.eval_subsets, embed)


def evaluate_sts(
    embed: EmbedFn | Mapping[str, EmbedFn], tasks: Sequence[str] = STS_TASKS, data_dir: str | Path | None = None
) -> StsReport:
    """Evaluate an encoder on STS ``tasks`` (names or aliases; default: all seven) from ``data_dir``, under both
    protocols: ``report.average("all")`` is the SimCSE-style "Avg.", ``report.average("wmean")`` the paper's.

    ``embed`` maps a list of N sentences to an (N, D) array, called once per task with its distinct evaluation
    sentences; a mapping from task name to such a function gives each task its own encoder (a calibrator fitted on
    that task: the "target" regime). InputError for an unknown task or a mapping without one of them;
    DataNotFoundError for missing data."""
    loaded = load_sts_tasks(tasks, data_dir)
    if isinstance(embed, Mapping):
        missing = [name for name in loaded if name not in embed]
        if missing:
            raise InputError(f"embed has no function for task(s) {', '.join(missing)}")
    scores: dict[str, TaskScore] = {}
    for name, task in loaded.items():
        s = scores[name] = evaluate_task(task, embed[name] if isinstance(embed, Mapping) else embed)
        logger.info("%s: spearman all=%.2f wmean=%.2f (%d pairs)", name, s.all_spearman, s.wmean_spearman, s.n_pairs)
    return StsReport(scores)
