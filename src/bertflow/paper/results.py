"""Results of the evaluation grid (each (pooling, calibrator, regime) cell's scores over its seeds, with the run's
metadata) and of the per-set protocol (each cell's per-set scores, summarised against the raw encoder), as JSON-ready
dictionaries. Their Markdown: :mod:`bertflow.paper.render`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..evaluation.sts import StsReport, SubsetScore
from .published import PublishedResult


def mean_std(values: Sequence[float]) -> dict[str, Any]:
    """mean, sample std (ddof=1; None for one value) and n of finite values; JSON-ready."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    n = len(arr)
    return {"mean": float(arr.mean()) if n else None, "std": float(arr.std(ddof=1)) if n > 1 else None, "n": n}


#: The key of an ``auto`` choice made by one fit that serves every task (the nli and corpus regimes).
ALL_TASKS = "all tasks"


@dataclass
class CellResult:
    """Scores of one (pooling, calibrator, regime) cell over its flow ``seeds`` (``[None]`` for deterministic
    calibrators): one :class:`StsReport` per seed in ``reports`` (tasks not evaluated missing), ``test_seen`` per task
    (``{"seen": k, "of": n}`` evaluation sentences in the fitting set; ``None`` where not evaluated), ``seconds`` of
    fitting and scoring (all seeds), ``error`` of a failed fit (then no scores), ``seen_note`` replacing the "test
    sentences seen" summary (a model fitted elsewhere) and an ``auto`` cell's choices as ``Embedder.fit`` records
    them, by task (:data:`ALL_TASKS` for a shared fit; empty for other calibrators)."""

    pooling: str
    calibrator: str
    regime: str
    seeds: list[int | None]
    tasks: list[str]
    reports: list[StsReport] = field(default_factory=list)
    test_seen: dict[str, dict[str, int] | None] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    seen_note: str | None = None
    auto: dict[str, dict[str, Any]] = field(default_factory=dict)

    def evaluated(self) -> list[str]:
        """Tasks with scores (all of them unless the regime does not apply to some)."""
        return [t for t in self.tasks if self.reports and t in self.reports[0].tasks]

    def task_stat(self, task: str, protocol: str, metric: str = "spearman") -> dict[str, Any] | None:
        """mean/std over seeds of one task's score, or ``None`` for a task that was not evaluated."""
        if not self.reports or task not in self.reports[0].tasks:
            return None
        return mean_std([r.tasks[task].score(protocol, metric) for r in self.reports])  # type: ignore[arg-type]

    def average_stat(self, protocol: str, metric: str = "spearman") -> dict[str, Any] | None:
        """mean/std over seeds of the average over the grid's tasks; ``None`` unless every task was evaluated."""
        if not self.reports or len(self.evaluated()) != len(self.tasks):
            return None
        return mean_std([r.average(protocol, metric) for r in self.reports])  # type: ignore[arg-type]

    def subset_stats(self, task: str) -> list[tuple[SubsetScore, dict[str, Any]]]:
        """Each subset of an evaluated ``task`` with the mean/std over seeds of its Spearman."""
        subsets = self.reports[0].tasks[task].subsets
        return [(s, mean_std([r.tasks[task].subsets[i].spearman for r in self.reports])) for i, s in enumerate(subsets)]

    def seen_summary(self) -> str:
        """A short statement of how many evaluation sentences the calibrator saw while fitting."""
        if self.seen_note is not None:
            return self.seen_note
        if self.regime == "none":
            return "n/a (no fitting)"
        counts = [v for v in self.test_seen.values() if v is not None]
        seen, total = sum(c["seen"] for c in counts), sum(c["of"] for c in counts)
        if total == 0:
            return "n/a"
        if seen == total:
            return "all (transductive)" if self.regime == "target" else f"all {total}"
        if seen == 0:
            return "none"
        return f"{seen} of {total} ({100 * seen / total:.1f}%)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per task mean/std under both conventions, per-subset means, averages and every run."""
        tasks: dict[str, Any] = dict.fromkeys(self.tasks)
        for t in self.evaluated():
            tasks[t] = {
                "all": self.task_stat(t, "all"),
                "wmean": self.task_stat(t, "wmean"),
                "pearson": {"all": self.task_stat(t, "all", "pearson"), "wmean": self.task_stat(t, "wmean", "pearson")},
                "subsets": [{"name": s.name, "n_pairs": s.n_pairs, "spearman": st} for s, st in self.subset_stats(t)],
            }
        return {
            "pooling": self.pooling,
            "calibrator": self.calibrator,
            "regime": self.regime,
            "seeds": self.seeds,
            "test_sentences_seen": self.test_seen,
            "test_sentences_seen_summary": self.seen_summary(),
            "tasks": tasks,
            "average": {p: self.average_stat(p) for p in ("all", "wmean")},
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "runs": [r.to_dict() for r in self.reports],
            **({"auto": self.auto} if self.auto else {}),
        }


@dataclass
class GridResult:
    """The ``cells`` of a grid (one :class:`CellResult` per pooling, calibrator, regime, in grid order) with ``meta``
    (JSON-ready: model, data, regimes, machine, timings, command) and the ``published`` rows of this model, or of the
    paper model ``GridConfig.paper_rows`` names (else empty)."""

    meta: dict[str, Any]
    cells: list[CellResult]
    published: list[PublishedResult] = field(default_factory=list)

    def raw_cell(self, pooling: str) -> CellResult | None:
        """The uncalibrated cell of ``pooling``, if the grid has one."""
        return next((c for c in self.cells if c.pooling == pooling and c.regime == "none"), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``meta``, ``cells`` and the published rows shown beside them."""
        keys = ("label", "model", "pooling", "calibrators", "regime", "protocol", "scores", "average", "source", "note")
        published = [{**{k: getattr(r, k) for k in keys}, "calibrators": list(r.calibrators)} for r in self.published]
        return {"meta": self.meta, "cells": [c.to_dict() for c in self.cells], "published": published}


# The per-set protocol (bertflow.paper.perset)

#: A set counts as harmed when its score falls more than this many Spearman x 100 points below its baseline.
HARM_MARGIN = 2.0


def fit_size_label(fit_size: int | None) -> str:
    """How reports name a fitting-set size: ``"all"`` (every sentence of the set) or the sample size."""
    return "all" if fit_size is None else str(fit_size)


@dataclass(frozen=True)
class SetSummary:
    """Per-set scores of one configuration against a baseline over the ``n_sets`` sets where both are finite
    (Spearman x 100): the plain ``mean`` of the scores and ``baseline_mean`` of the baseline, ``mean_delta`` (their
    difference), the ``worst_set`` (lowest ``score - baseline``) and ``worst_delta`` (that difference, negative
    below the baseline), and ``n_below``, the sets with ``score - baseline < -margin`` (points)."""

    n_sets: int
    mean: float
    baseline_mean: float
    mean_delta: float
    worst_set: str
    worst_delta: float
    n_below: int
    margin: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def summarize_sets(
    scores: Mapping[str, float], baseline: Mapping[str, float], *, margin: float = HARM_MARGIN
) -> SetSummary | None:
    """Mean, worst set relative to ``baseline`` and the count of sets more than ``margin`` points below it, from
    Spearman x 100 per set name; sets missing from ``baseline`` or not finite on either side are left out. ``None``
    when no set can be compared; ties for the worst set go to the first in order."""
    names = [s for s in scores if s in baseline and math.isfinite(scores[s]) and math.isfinite(baseline[s])]
    if not names:
        return None
    deltas = {s: scores[s] - baseline[s] for s in names}
    worst = min(names, key=lambda s: deltas[s])
    mean, baseline_mean = float(np.mean([scores[s] for s in names])), float(np.mean([baseline[s] for s in names]))
    return SetSummary(
        n_sets=len(names),
        mean=mean,
        baseline_mean=baseline_mean,
        mean_delta=mean - baseline_mean,
        worst_set=worst,
        worst_delta=float(deltas[worst]),
        n_below=sum(1 for s in names if deltas[s] < -margin),
        margin=margin,
    )


@dataclass
class PerSetCell:
    """One (pooling, calibrator, fitting-set size) of the per-set protocol: a Spearman x 100 per evaluation set.

    ``pooling``: the key (``"sif-first-last-avg"`` ...), ``base_pooling`` the same without weighting; ``calibrator``:
    the spec (``"none"``: raw); ``fit_size``: sentences each set's calibrator (and token statistics) was fitted on
    (``None``: all of the set's, else a seeded sample; sets with no more are not scored); ``seeds``: the flow seeds
    (``[None]`` for deterministic calibrators); ``runs``: per set, one score per seed (NaN where undefined);
    ``seconds`` of fitting and scoring; ``error`` of a failed fit (then no scores); ``auto``: an ``auto`` cell's
    choice per set, as ``Embedder.fit`` records it.
    """

    pooling: str
    base_pooling: str
    calibrator: str
    fit_size: int | None
    seeds: list[int | None]
    runs: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    auto: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def weighted(self) -> bool:
        """Whether the pooling is frequency-weighted (its token statistics come from the fitting sample)."""
        return self.pooling != self.base_pooling

    @property
    def label(self) -> str:
        """``"pooling / calibrator / fit size"``, how reports and the selection name the configuration."""
        return f"{self.pooling} / {self.calibrator} / {fit_size_label(self.fit_size)}"

    def scores(self) -> dict[str, float]:
        """Spearman x 100 per set, the mean over seeds (empty for a failed cell)."""
        if self.error:
            return {}
        return {s: float(np.mean(v)) for s, v in self.runs.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; per set the mean, std and n over seeds (``None`` where undefined) and every run."""
        return {
            "pooling": self.pooling,
            "base_pooling": self.base_pooling,
            "calibrator": self.calibrator,
            "fit_size": self.fit_size,
            "seeds": self.seeds,
            "sets": {
                s: {**mean_std(v), "runs": [None if math.isnan(x) else x for x in v]} for s, v in self.runs.items()
            },
            "seconds": round(self.seconds, 2),
            "error": self.error,
            **({"auto": self.auto} if self.auto else {}),
        }


@dataclass
class PerSetResult:
    """The ``cells`` of a per-set run (raw ones, calibrator ``none``, and calibrated, in run order) with ``meta``
    (JSON-ready: model, protocol, fitting sizes, machine, timings, command), ``sets`` (per set: ``dataset``,
    ``n_pairs``, ``n_sentences``), ``fits`` (per set and fit-size label: ``n_fit`` sentences and ``seen``, the
    evaluation sentences among them; ``None`` where the set is too small), the harm ``margin`` of every summary
    (points) and the ``lodo`` selections :func:`bertflow.paper.lodo.select_lodo` attaches."""

    meta: dict[str, Any]
    sets: dict[str, dict[str, Any]]
    fits: dict[str, dict[str, dict[str, Any] | None]]
    cells: list[PerSetCell]
    margin: float = HARM_MARGIN
    lodo: list[Any] = field(default_factory=list)

    @property
    def fit_sizes(self) -> list[int | None]:
        """The fitting-set sizes of the run, ``None`` (all) first."""
        return list(dict.fromkeys(c.fit_size for c in sorted(self.cells, key=lambda c: c.fit_size or 0)))

    def _raw(self, pooling: str, fit_size: int | None) -> PerSetCell | None:
        wanted = (pooling, "none", fit_size)
        return next((c for c in self.cells if (c.pooling, c.calibrator, c.fit_size) == wanted), None)

    def raw_cell(self, cell: PerSetCell) -> PerSetCell | None:
        """The raw encoder under ``cell``'s pooling without weighting or calibrator (the protocol's baseline)."""
        return self._raw(cell.base_pooling, None)

    def weighted_raw_cell(self, cell: PerSetCell) -> PerSetCell | None:
        """For a weighted pooling: the same weighted pooling without calibrator, weighted by the same fitting
        samples (``None`` for an unweighted pooling)."""
        return self._raw(cell.pooling, cell.fit_size) if cell.weighted else None

    def summary(self, cell: PerSetCell, *, against: str = "raw") -> SetSummary | None:
        """``cell`` against the raw encoder (``against="raw"``) or, for a weighted pooling, against the same weighted
        pooling uncalibrated (``"weighted-raw"``); ``None`` when there is no such baseline or no score."""
        base = self.raw_cell(cell) if against == "raw" else self.weighted_raw_cell(cell)
        if base is None or base is cell or cell.error:  # a baseline is not summarised against itself
            return None
        return summarize_sets(cell.scores(), base.scores(), margin=self.margin)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``meta``, ``sets``, ``fits``, ``cells`` (each with its summaries) and ``lodo``."""
        cells = []
        for c in self.cells:
            raw, wraw = self.summary(c), self.summary(c, against="weighted-raw")
            summaries = {"summary_vs_raw": raw and raw.to_dict(), "summary_vs_weighted_raw": wraw and wraw.to_dict()}
            cells.append({**c.to_dict(), **summaries})
        lodo = [s.to_dict() for s in self.lodo]
        return {"meta": self.meta, "sets": self.sets, "fits": self.fits, "cells": cells, "lodo": lodo}
