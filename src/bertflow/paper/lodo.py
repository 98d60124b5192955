"""Leave-one-dataset-out selection: choose among candidate configurations without looking at the scored dataset.
For each dataset D (one of the seven STS tasks with all its sets), every candidate is scored by the
:class:`Objective` on the *other* datasets' per-set results, the best one (ties: the first listed) is picked and
scored on D's sets."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..evaluation.datasets import STS_TASKS
from .results import HARM_MARGIN, PerSetResult, SetSummary, fit_size_label, summarize_sets


@dataclass(frozen=True)
class Objective:
    """The selection objective: mean score minus ``penalty`` points per set more than ``margin`` points below raw."""

    margin: float = HARM_MARGIN
    penalty: float = 1.0

    def __call__(self, scores: Mapping[str, float], raw: Mapping[str, float], sets: Sequence[str]) -> float:
        """J over ``sets`` (each in ``scores`` and ``raw``), Spearman x 100 points."""
        if not sets:
            raise InputError("the objective needs at least one set")
        harmed = sum(1 for s in sets if scores[s] - raw[s] < -self.margin)
        return float(np.mean([scores[s] for s in sets])) - self.penalty * harmed

    def describe(self) -> str:
        """One line for reports."""
        return (f"mean Spearman over the other datasets' sets minus {self.penalty:g} point(s) per set more than "
                f"{self.margin:g} points below raw (same pooling, no weighting, no calibrator)")  # fmt: skip


@dataclass(frozen=True)
class LodoFold:
    """One ``held_out`` dataset (``"STS12"`` ...): the candidate ``picked`` on the others (maximising the objective,
    ``objective`` the maximum), the held-out dataset's sets and the ``summary`` of the pick on them against its raw
    baseline."""

    held_out: str
    picked: str
    objective: float
    held_out_sets: tuple[str, ...]
    summary: SetSummary

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"held_out": self.held_out, "picked": self.picked, "objective_on_others": self.objective,
                "held_out_sets": list(self.held_out_sets), "held_out_summary": self.summary.to_dict()}  # fmt: skip


@dataclass
class LodoSelection:
    """The result of :func:`leave_one_dataset_out`: the ``fit_size`` the candidates share (``None``: all of each
    set's sentences), the ``candidates`` in tie-break order, one fold per dataset with a set, ``pooled`` (every
    set's score from the pick of its own dataset's fold against that pick's raw baseline: the out-of-sample estimate
    of the rule), ``in_sample`` (the candidate maximising the objective on all sets), the ``objective`` and the
    candidates ``excluded`` for missing a set (failed fits), with the reason."""

    fit_size: int | None
    candidates: list[str]
    folds: list[LodoFold]
    pooled: SetSummary
    in_sample: str
    objective: Objective
    excluded: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        o = self.objective
        return {"fit_size": self.fit_size, "objective": o.describe(), "margin": o.margin, "penalty": o.penalty,
                "candidates": self.candidates, "excluded": self.excluded, "folds": [f.to_dict() for f in self.folds],
                "pooled_held_out": self.pooled.to_dict(), "in_sample_pick": self.in_sample}  # fmt: skip


def _defined(values: Mapping[str, float], name: str) -> bool:
    """Whether ``values`` has a finite score for set ``name`` (an undefined correlation is NaN)."""
    return name in values and math.isfinite(values[name])


def leave_one_dataset_out(
    scores: Mapping[str, Mapping[str, float]],
    raw: Mapping[str, Mapping[str, float]],
    dataset_of: Mapping[str, str],
    *,
    objective: Objective | None = None,
    fit_size: int | None = None,
) -> LodoSelection:
    """Pick a candidate per held-out dataset on the other datasets' sets and score it on the held-out ones.

    ``scores``: per candidate label (in tie-break order), Spearman x 100 per set, finite on every set used; ``raw``:
    per candidate, its raw baseline per set; ``dataset_of``: each set's dataset (``"STS12/MSRpar" -> "STS12"``), its
    sets the ones used. InputError for no candidate, fewer than two datasets, or a candidate or baseline missing a
    set.
    """
    objective = objective or Objective()
    labels = list(scores)
    sets = list(dataset_of)
    if not labels:
        raise InputError("leave-one-dataset-out needs at least one candidate")
    for label in labels:
        missing = [s for s in sets if not _defined(scores[label], s) or not _defined(raw.get(label, {}), s)]
        if missing:
            raise InputError(f"candidate {label!r} has no score or baseline on {', '.join(missing[:3])}")
    order = {d: i for i, d in enumerate(STS_TASKS)}
    datasets = sorted(dict.fromkeys(dataset_of.values()), key=lambda d: order.get(d, len(order)))
    if len(datasets) < 2:
        raise InputError("leave-one-dataset-out needs sets from at least two datasets")

    def best(on: list[str]) -> tuple[str, float]:
        values = [objective(scores[c], raw[c], on) for c in labels]
        i = int(np.argmax(values))  # first maximum: the tie-break order
        return labels[i], values[i]

    folds = []
    for d in datasets:
        held = [s for s in sets if dataset_of[s] == d]
        picked, value = best([s for s in sets if dataset_of[s] != d])
        summary = summarize_sets({s: scores[picked][s] for s in held}, raw[picked], margin=objective.margin)
        assert summary is not None  # every score and baseline was checked finite above
        folds.append(LodoFold(d, picked, value, tuple(held), summary))
    pooled_scores = {s: scores[f.picked][s] for f in folds for s in f.held_out_sets}
    pooled_raw = {s: raw[f.picked][s] for f in folds for s in f.held_out_sets}
    pooled = summarize_sets(pooled_scores, pooled_raw, margin=objective.margin)
    assert pooled is not None  # every fold has a summary
    return LodoSelection(fit_size, labels, folds, pooled, best(sets)[0], objective)


def select_lodo(
    result: PerSetResult, *, objective: Objective | None = None, candidates: Sequence[str] | None = None
) -> list[LodoSelection]:
    """:func:`leave_one_dataset_out` over the cells of a per-set run, one selection per fitting-set size with at
    least two datasets scored.

    The candidates at a size are its cells plus the raw unweighted cells (the raw encoder does not depend on the
    size), restricted to the sets scored at that size, and to ``candidates`` (``"pooling / calibrator"`` labels) if
    given; a cell that failed, or whose correlation is undefined (NaN) on a set, is left out and listed.
    """
    objective = objective or Objective(margin=result.margin)
    out = []
    for size in result.fit_sizes:
        cells = [c for c in result.cells if c.fit_size == size or (c.calibrator == "none" and not c.weighted)]
        if candidates is not None:
            cells = [c for c in cells if f"{c.pooling} / {c.calibrator}" in candidates]
        # The sets scored at this size: those with a fitting sample of it.
        sets = [s for s, by_size in result.fits.items() if by_size.get(fit_size_label(size)) is not None]
        scores, raw, excluded = {}, {}, {}
        for c in cells:
            base = result.raw_cell(c)
            got, base_scores = c.scores(), base.scores() if base else {}
            lacking = [s for s in sets if not _defined(got, s) or not _defined(base_scores, s)]
            label = f"{c.pooling} / {c.calibrator}"
            if c.error or lacking:
                excluded[label] = c.error or f"no score on {', '.join(lacking[:3])}"
                continue
            scores[label], raw[label] = got, base_scores
        dataset_of = {s: result.sets[s]["dataset"] for s in sets}
        if not scores or len(set(dataset_of.values())) < 2:
            continue
        selection = leave_one_dataset_out(scores, raw, dataset_of, objective=objective, fit_size=size)
        selection.excluded = excluded
        out.append(selection)
    return out
