"""Results of the evaluation grid: the scores of each (pooling, calibrator, regime) cell over its seeds, and the
grid's cells with the run's metadata, as JSON-ready dictionaries (Markdown: :mod:`bertflow.evaluation.render`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .paper import PublishedResult
from .sts import StsReport

__all__ = ["CellResult", "GridResult", "mean_std"]


def mean_std(values: Sequence[float]) -> dict[str, Any]:
    """mean, sample std (ddof=1; None for one value) and n of finite values; JSON-ready."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    if not len(arr):
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if len(arr) > 1 else None,
        "n": int(len(arr)),
    }


@dataclass
class CellResult:
    """Scores of one (pooling, calibrator, regime) cell, over one or several seeds.

    Attributes:
        pooling, calibrator, regime: the cell.
        seeds: the flow seeds used (``[None]`` for deterministic calibrators).
        tasks: the tasks of the grid, in order.
        reports: one :class:`StsReport` per seed, holding the tasks that were evaluated (n/a tasks missing).
        test_seen: per task, ``{"seen": k, "of": n}`` evaluation sentences contained in the fitting set, or
            ``None`` where the task was not evaluated.
        seconds: wall time of fitting and scoring the cell, all seeds.
        error: the message of a failed fit (the cell then has no scores).
    """

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
        tasks: dict[str, Any] = {}
        for t in self.tasks:
            if self.task_stat(t, "all") is None:
                tasks[t] = None
                continue
            first = self.reports[0].tasks[t]
            tasks[t] = {
                "all": self.task_stat(t, "all"),
                "wmean": self.task_stat(t, "wmean"),
                "pearson": {"all": self.task_stat(t, "all", "pearson"), "wmean": self.task_stat(t, "wmean", "pearson")},
                "subsets": [
                    {
                        "name": s.name,
                        "n_pairs": s.n_pairs,
                        "spearman": mean_std([r.tasks[t].subsets[i].spearman for r in self.reports]),
                    }
                    for i, s in enumerate(first.subsets)
                ],
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
        }


@dataclass
class GridResult:
    """The cells of a grid with everything needed to read them: model, protocol, machine, time.

    Attributes:
        meta: JSON-ready description of the run (model, data, regimes, machine, timings, command).
        cells: one :class:`CellResult` per (pooling, calibrator, regime), in grid order.
        published: the papers' rows for this model, or for the paper model ``GridConfig.paper_rows`` names (empty
            otherwise).
    """

    meta: dict[str, Any]
    cells: list[CellResult]
    published: list[PublishedResult] = field(default_factory=list)

    def raw_cell(self, pooling: str) -> CellResult | None:
        """The uncalibrated cell of ``pooling``, if the grid has one."""
        return next((c for c in self.cells if c.pooling == pooling and c.regime == "none"), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``meta``, ``cells`` and the published rows shown beside them."""
        return {
            "meta": self.meta,
            "cells": [c.to_dict() for c in self.cells],
            "published": [
                {
                    "label": r.label,
                    "model": r.model,
                    "pooling": r.pooling,
                    "calibrators": list(r.calibrators),
                    "regime": r.regime,
                    "protocol": r.protocol,
                    "scores": r.scores,
                    "average": r.average,
                    "source": r.source,
                    "note": r.note,
                }
                for r in self.published
            ],
        }

    def to_markdown(self, *, title: str = "bertflow reproduce", subsets: bool = False) -> str:
        """The report: settings, a summary table, per-task tables under both conventions, published rows.

        Args:
            title: the page's heading.
            subsets: also list per-subset Spearman for every cell (long; ``bertflow evaluate`` uses it).
        """
        from .render import render_markdown

        return render_markdown(self, title=title, subsets=subsets)
