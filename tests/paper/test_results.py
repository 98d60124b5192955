"""The per-set summaries of bertflow.paper.results (mean, worst set and count below a baseline)."""

from __future__ import annotations

import math

import pytest

from bertflow.paper.results import summarize_sets


def test_summary_against_a_hand_computation() -> None:
    raw = {"a": 50.0, "b": 60.0, "c": 70.0, "d": 40.0, "e": 30.0}
    got = {"a": 55.0, "b": 57.5, "c": 67.9, "d": 41.0, "e": math.nan}
    s = summarize_sets(got, raw)
    assert s is not None
    # e is left out (undefined); deltas a +5, b -2.5, c -2.1, d +1.
    assert s.n_sets == 4 and s.worst_set == "b" and s.worst_delta == pytest.approx(-2.5)
    assert s.n_below == 2  # b and c are more than 2 below; exactly -2 would not count
    assert s.mean == pytest.approx((55 + 57.5 + 67.9 + 41) / 4)
    assert s.mean_delta == pytest.approx((5 - 2.5 - 2.1 + 1) / 4)
    assert summarize_sets({"a": 48.0}, {"a": 50.0}).n_below == 0  # type: ignore[union-attr]
    assert summarize_sets({"a": 47.0}, {"a": 50.0}, margin=3.5).n_below == 0  # type: ignore[union-attr]
    assert summarize_sets({"x": 1.0}, raw) is None
