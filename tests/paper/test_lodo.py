"""Leave-one-dataset-out selection (bertflow.paper.lodo): on hand-made score tables, then over a per-set run."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from bertflow import SentenceEncoder
from bertflow.errors import InputError
from bertflow.paper.lodo import Objective, leave_one_dataset_out, select_lodo
from bertflow.paper.perset import run_per_set

from ..sts_layout import encoder, layout, one_torch_thread, per_set_config, working_tiny_bert  # noqa: F401 - fixtures

DATASET_OF = {"A/1": "STS12", "A/2": "STS12", "B": "STS13", "C": "STS14", "D": "STS-B"}


def _table() -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    raw = {"A/1": 50.0, "A/2": 50.0, "B": 50.0, "C": 50.0, "D": 50.0}
    scores = {
        "raw": dict(raw),
        # Great on STS12, collapses elsewhere: never picked when STS12 is not what it is chosen on.
        "greedy": {"A/1": 60.0, "A/2": 60.0, "B": 40.0, "C": 45.0, "D": 40.0},
        "robust": {"A/1": 51.0, "A/2": 51.0, "B": 53.0, "C": 53.0, "D": 53.0},
    }
    return scores, {c: raw for c in scores}


def test_lodo_picks_on_the_other_datasets_only() -> None:
    scores, raw = _table()
    sel = leave_one_dataset_out(scores, raw, DATASET_OF)
    picks = {f.held_out: f.picked for f in sel.folds}
    assert picks == {"STS12": "robust", "STS13": "robust", "STS14": "robust", "STS-B": "robust"}
    # The objective by hand: mean 49 minus one point for each of the three sets more than 2 below raw.
    assert Objective()(scores["greedy"], raw["greedy"], list(DATASET_OF)) == pytest.approx(49 - 3)
    assert sel.in_sample == "robust" and sel.candidates == ["raw", "greedy", "robust"]
    # Held-out scores are the picked candidate's on the held-out sets, pooled over folds.
    sts12 = sel.folds[0]
    assert sts12.held_out_sets == ("A/1", "A/2") and sts12.summary.mean == pytest.approx(51.0)
    assert sel.pooled.n_sets == 5 and sel.pooled.mean == pytest.approx(np.mean([51, 51, 53, 53, 53]))
    assert sel.pooled.n_below == 0


def test_lodo_never_uses_the_held_out_scores_to_pick() -> None:
    scores, raw = _table()
    rng = random.Random(0)
    base = leave_one_dataset_out(scores, raw, DATASET_OF)
    for fold in base.folds:
        for _ in range(20):
            shaken = {c: dict(v) for c, v in scores.items()}
            for c in shaken:
                for s in fold.held_out_sets:
                    shaken[c][s] = rng.uniform(-100, 100)
            again = leave_one_dataset_out(shaken, raw, DATASET_OF)
            f = next(x for x in again.folds if x.held_out == fold.held_out)
            assert f.picked == fold.picked and f.objective == pytest.approx(fold.objective)
            # ... and its objective is the objective on the other sets, computed by hand.
            others = [s for s in DATASET_OF if DATASET_OF[s] != fold.held_out]
            assert f.objective == pytest.approx(Objective()(scores[f.picked], raw[f.picked], others))


def test_lodo_penalty_and_errors() -> None:
    scores, raw = _table()
    # Spiky: +20 on STS12's two sets, 3 below raw on every other set.
    scores["spiky"] = {"A/1": 70.0, "A/2": 70.0, "B": 47.0, "C": 47.0, "D": 47.0}
    raw["spiky"] = raw["raw"]
    # Held out STS13: spiky's mean on the others is 58.5 against robust's 52, with two harmed sets.
    for penalty, pick in ((0.0, "spiky"), (1.0, "spiky"), (4.0, "robust")):
        sel = leave_one_dataset_out(scores, raw, DATASET_OF, objective=Objective(penalty=penalty))
        assert {f.held_out: f.picked for f in sel.folds}["STS13"] == pick
    # A larger margin forgives a 3-point loss.
    sel = leave_one_dataset_out(scores, raw, DATASET_OF, objective=Objective(margin=3.5, penalty=4.0))
    assert {f.held_out: f.picked for f in sel.folds}["STS13"] == "spiky"
    with pytest.raises(InputError, match="no score or baseline"):
        leave_one_dataset_out({"x": {"A/1": 1.0}}, {"x": {"A/1": 1.0}}, DATASET_OF)
    scores["raw"]["B"] = math.nan  # an undefined correlation is never picked as a maximum
    with pytest.raises(InputError, match="'raw' has no score or baseline on B"):
        leave_one_dataset_out(scores, raw, DATASET_OF)
    with pytest.raises(InputError, match="two datasets"):
        leave_one_dataset_out(scores, raw, {"A/1": "STS12", "A/2": "STS12"})


def test_select_lodo_on_a_run(encoder: SentenceEncoder, layout: Path) -> None:
    result = run_per_set(
        per_set_config(
            layout, poolings=["mean", "cls"], calibrators=["none", "whitening", "standard-norm"], fit_sizes=[30]
        ),
        encoder=encoder,
    )
    selections = select_lodo(result)
    assert [s.fit_size for s in selections] == [None, 30]
    full, small = selections
    assert len(full.folds) == 7 and full.pooled.n_sets == 9
    expected = {f"{p} / {c}" for p in ("mean", "cls") for c in ("none", "whitening", "standard-norm")}
    assert set(full.candidates) == expected
    assert small.pooled.n_sets == 8  # the plagiarism subset has too few sentences for 30
    assert "mean / none" in small.candidates  # the raw encoder is a candidate at every size
    for fold in full.folds:
        held = set(fold.held_out_sets)
        assert held == {s for s, v in result.sets.items() if v["dataset"] == fold.held_out}
