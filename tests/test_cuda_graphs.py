"""GraphedFunction (cuda_graphs.py): one function replayed from CUDA graphs per input shape. Its calibrator use is
tested in tests/calibrators/test_device.py, its encoder use in tests/encoding/test_graphs.py; here the options
that only the encoder uses (capture at first sight, no warm-up run, captures asked for in advance, close)."""

from __future__ import annotations

import pytest
import torch

from bertflow.cuda_graphs import GraphedFunction

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_graphs_need_a_cuda_device_and_a_capture_count():
    with pytest.raises(ValueError, match="CUDA"):
        GraphedFunction(torch.neg, "cpu", max_graphs=2)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="capture_at"):
            GraphedFunction(torch.neg, "cuda", max_graphs=2, capture_at=0)


def _fn(x: torch.Tensor) -> torch.Tensor:
    """Several kernels and an intermediate: (x * 2 + 1).cumsum(1) in float32."""
    return (x.float() * 2 + 1).cumsum(1)


@cuda
def test_capture_at_first_sight_without_a_warm_up_run_replays_the_function():
    fast = GraphedFunction(_fn, "cuda", max_graphs=4, capture_at=1, warm_up=False, input_dtype=None)
    for seed in range(4):  # every call, the first one included, comes from the graph after the first capture
        x = torch.randint(0, 100, (8, 16), dtype=torch.int32, device="cuda") + seed
        with torch.inference_mode():
            assert torch.equal(fast(x), _fn(x))
    assert fast.shapes == [(8, 16)]
    y = torch.randn(8, 16, device="cuda")  # another dtype: another graph, as input_dtype=None keys by it
    assert torch.equal(fast(y), _fn(y)) and fast.shapes == [(8, 16), (8, 16)]


@cuda
def test_shapes_captured_in_advance_then_replayed_and_closed():
    calls = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return _fn(x)

    fast = GraphedFunction(counted, "cuda", max_graphs=4, capture_at=1, warm_up=False, input_dtype=None)
    for n in (4, 8):
        fast.capture(torch.zeros((n, 16), dtype=torch.int32, device="cuda"))
    assert sorted(fast.shapes) == [(4, 16), (8, 16)]
    before = len(calls)
    x = torch.arange(64, dtype=torch.int32, device="cuda").view(4, 16)
    assert torch.equal(fast(x), _fn(x)) and len(calls) == before  # a replay: the Python function did not run
    fast.close()
    assert fast.shapes == []
    assert torch.equal(fast(x), _fn(x))  # captured again on the next call
