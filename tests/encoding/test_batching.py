"""Batch planning (bertflow.encoding.batching.plan_batches): the token budget, row caps, padding bounds, min_tokens."""

from __future__ import annotations

import gc
import sys
import weakref

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


def test_prefetcher_low_latency_is_counted_and_restored():
    """``low_latency`` lowers Python's switch interval and defers full collections while any such prefetcher runs and
    restores both after the last one closes (two at once, closed in either order); without it both are left alone."""
    before, thresholds = sys.getswitchinterval(), gc.get_threshold()
    plain = Prefetcher(iter(range(3)), lambda x: x, 1, 2)
    assert list(plain) == [0, 1, 2] and sys.getswitchinterval() == before and gc.get_threshold() == thresholds
    plain.close()
    a = Prefetcher(iter(range(3)), lambda x: x * 2, 2, 3, low_latency=True)
    b = Prefetcher(iter(range(2)), lambda x: x, 1, 2, low_latency=True)
    held = (*thresholds[:2], gc.get_threshold()[2])
    assert sys.getswitchinterval() == min(before, FAST_SWITCH_INTERVAL)
    assert gc.get_threshold() == held and held[2] > 10**9  # young generations as they were, full ones deferred
    assert list(a) == [0, 2, 4]
    a.close()
    a.close()  # twice: counted once
    assert sys.getswitchinterval() == min(before, FAST_SWITCH_INTERVAL) and gc.get_threshold() == held
    assert list(b) == [0, 1]
    b.close()
    assert sys.getswitchinterval() == before and gc.get_threshold() == thresholds


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's collector is incremental: no full collections")
def test_full_collections_wait_for_a_low_latency_prefetcher_and_young_ones_do_not():
    """Allocations that set off a full collection without a low-latency prefetcher set off none while one runs, and
    cyclic garbage made then is still freed by the young generations' collections."""
    full = []

    def count(phase, info):
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    class Node:
        pass

    def allocate() -> bool:
        kept = [[] for _ in range(1_500_000)]  # survivors, so the oldest generation's count and pending grow
        cycle = Node()
        cycle.me = cycle
        probe = weakref.ref(cycle)
        del cycle
        for _ in range(20_000):  # enough allocations for several young collections
            kept.append([])
        del kept
        return probe() is None

    gc.collect()
    gc.callbacks.append(count)
    try:
        assert allocate() and full, "the control: these allocations set off a full collection"
        full.clear()
        gc.collect()
        full.clear()
        p = Prefetcher(iter(range(2)), lambda x: x, 1, 2, low_latency=True)
        try:
            assert allocate(), "a young collection freed the cycle"
            assert not full
        finally:
            p.close()
    finally:
        gc.callbacks.remove(count)


@pytest.mark.parametrize("plan", [plan_batches, plan_packed_batches])
@pytest.mark.parametrize(("max_tokens", "max_rows"), [(0, None), (-5, 4), (64, 0)])
def test_both_planners_refuse_a_budget_that_is_not_positive(plan, max_tokens, max_rows):
    with pytest.raises(InputError, match="max_tokens and batch_size must be positive"):
        plan(np.array([5, 3, 2]), max_tokens, max_rows)
