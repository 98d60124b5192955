"""Batch planning (bertflow.encoding.batching.plan_batches): the token budget, row caps, padding bounds, min_tokens."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bertflow.encoding.batching import FAST_SWITCH_INTERVAL, Prefetcher, plan_batches, plan_packed_batches
from bertflow.errors import InputError


def test_plan_batches_covers_everything_within_budget():
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(3, 40, size=500))[::-1]
    cases = [
        (64, None, 0.5, 0.9),
        (256, 7, 0.5, 0.0),
        (1000, None, 0.0, 0.0),
        (1000, None, 2.0, 0.0),
        (10, None, 0.5, 0.5),
    ]
    for max_tokens, max_rows, fill, ratio in cases:
        batches = plan_batches(lengths, max_tokens, max_rows, fill, ratio)
        assert batches[0][0] == 0 and batches[-1][1] == len(lengths)
        assert all(a[1] == b[0] for a, b in zip(batches[:-1], batches[1:], strict=True))
        for start, stop in batches:
            rows, width = stop - start, lengths[start]
            assert rows == 1 or rows * width <= max_tokens
            assert max_rows is None or rows <= max_rows
            assert lengths[stop - 1] >= ratio * width  # padding bounded by min_length_ratio
        if fill == 0.0:  # every batch holds one length: no padding anywhere
            assert all(lengths[start] == lengths[stop - 1] for start, stop in batches)
    greedy = plan_batches(lengths, 1000, None, 2.0, 0.0)
    assert all(stop - start == min(1000 // lengths[start], len(lengths) - start) for start, stop in greedy)


def test_min_tokens_keeps_small_batches_from_forming():
    lengths = np.array([40] * 3 + [30] * 3 + [20] * 3 + [10] * 200)
    strict = plan_batches(lengths, 4000, None, 0.5, 0.9, 0)
    assert strict == [(0, 3), (3, 6), (6, 9), (9, 209)]  # the 90% length rule alone: three tiny batches
    filled = plan_batches(lengths, 4000, None, 0.5, 0.9, 1000)
    assert filled == [(0, 25), (25, 209)]  # topped up to >= 1000 padded tokens, accepting padding


def test_prefetcher_fast_switch_is_counted_and_restored():
    """``fast_switch`` lowers Python's switch interval while any such prefetcher runs and restores it after the last
    one closes (two at once, closed in either order); without it the interval is left alone."""
    before = sys.getswitchinterval()
    plain = Prefetcher(iter(range(3)), lambda x: x, 1, 2)
    assert list(plain) == [0, 1, 2] and sys.getswitchinterval() == before
    plain.close()
    a = Prefetcher(iter(range(3)), lambda x: x * 2, 2, 3, fast_switch=True)
    b = Prefetcher(iter(range(2)), lambda x: x, 1, 2, fast_switch=True)
    assert sys.getswitchinterval() == min(before, FAST_SWITCH_INTERVAL)
    assert list(a) == [0, 2, 4]
    a.close()
    a.close()  # twice: counted once
    assert sys.getswitchinterval() == min(before, FAST_SWITCH_INTERVAL)
    assert list(b) == [0, 1]
    b.close()
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("plan", [plan_batches, plan_packed_batches])
@pytest.mark.parametrize(("max_tokens", "max_rows"), [(0, None), (-5, 4), (64, 0)])
def test_both_planners_refuse_a_budget_that_is_not_positive(plan, max_tokens, max_rows):
    with pytest.raises(InputError, match="max_tokens and batch_size must be positive"):
        plan(np.array([5, 3, 2]), max_tokens, max_rows)
