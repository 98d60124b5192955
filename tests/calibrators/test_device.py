"""fast_torch_transform: the calibrator's torch transform, replayed from CUDA graphs on a GPU, eager elsewhere.

The CUDA tests skip on machines without a GPU; they ran on the lent H100 (see benchmarks/calibrator_overhead_gpu.py
and docs for the record).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from bertflow import ChainCalibrator, FlowCalibrator, StandardNormCalibrator, WhiteningCalibrator
from bertflow.calibrators import AnchoredWhiteningCalibrator, Calibrator
from bertflow.calibrators.device import fast_torch_transform, graphed_transform
from bertflow.cuda_graphs import GraphedFunction

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

D = 24


def _data(n: int = 600, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, D)) @ rng.normal(size=(D, D))
    return (base + 0.3 * base**2 / 10 + 5.0).astype(np.float32)


def _calibrators() -> dict[str, Calibrator]:
    X = _data()
    return {
        "flow": FlowCalibrator(max_steps=20, device="cpu").fit(X),
        "whitening": WhiteningCalibrator().fit(X),
        "whitening-8": WhiteningCalibrator(8).fit(X),
        "chain": ChainCalibrator([StandardNormCalibrator(), WhiteningCalibrator(12)]).fit(X),
        "anchored": AnchoredWhiteningCalibrator().fit(X),
    }


CALIBRATORS = _calibrators()
NAMES = sorted(CALIBRATORS)


class _ViaNumpy(StandardNormCalibrator):
    """A calibrator with no torch transform of its own (the base class's numpy round trip)."""

    _torch_transform = Calibrator._torch_transform


# -- CPU: the plain transform ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_cpu_is_the_eager_transform(name):
    cal = CALIBRATORS[name]
    x = torch.from_numpy(_data(50, seed=1))
    fast = fast_torch_transform(cal, "cpu")
    assert not isinstance(fast, GraphedFunction)
    assert torch.equal(fast(x), cal.torch_transform("cpu")(x))
    np.testing.assert_allclose(fast(x).numpy(), cal.transform(x.numpy()), rtol=1e-4, atol=1e-4)


def test_graphs_need_a_cuda_device():
    with pytest.raises(ValueError, match="CUDA"):
        graphed_transform(CALIBRATORS["whitening"].torch_transform("cpu"), "cpu")


def test_unfitted_raises():
    from bertflow import NotFittedError

    with pytest.raises(NotFittedError):
        fast_torch_transform(WhiteningCalibrator(), "cpu")


# -- CUDA: graphs -----------------------------------------------------------------------------------------------

SIZES = [1, 7, 300, 4096, 11328]


def _rows(n: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(n, D, device="cuda", generator=g) * 3 + 5).to(dtype)


@cuda
@pytest.mark.parametrize("name", NAMES)
def test_graph_equals_eager_bit_for_bit(name):
    cal = CALIBRATORS[name]
    eager = cal.torch_transform("cuda")
    fast = graphed_transform(cal.torch_transform("cuda"), torch.device("cuda", torch.cuda.current_device()))
    seed = 0
    for _ in range(3):  # eager (first sighting), capture + replay, replay
        for n in SIZES:
            seed += 1
            x = _rows(n, seed)  # fresh rows every call: a replay that kept stale input would differ
            with torch.inference_mode():  # as the encoder calls it
                got, want = fast(x), eager(x)
            assert got.dtype == torch.float32 and got.shape == want.shape
            assert torch.equal(got, want), f"{name} rows={n}: max |diff| {(got - want).abs().max().item():.3e}"
    assert sorted(fast.shapes) == sorted((n, D) for n in SIZES)


@cuda
def test_bf16_input_is_cast_like_the_eager_transform():
    cal = CALIBRATORS["flow"]
    eager, fast = cal.torch_transform("cuda"), graphed_transform(cal.torch_transform("cuda"), "cuda")
    assert fast.device == torch.device("cuda", torch.cuda.current_device())  # inputs carry the index
    for seed in range(3):
        x = _rows(256, seed, torch.bfloat16)
        assert torch.equal(fast(x), eager(x))
    assert fast.shapes == [(256, D)]


@cuda
def test_outputs_are_not_aliased_to_the_graph_buffers():
    cal = CALIBRATORS["whitening"]
    fast = graphed_transform(cal.torch_transform("cuda"), torch.device("cuda:0"))
    fast(_rows(64, 0))
    first = fast(_rows(64, 1))  # captured here
    kept = first.clone()
    second = fast(_rows(64, 2))  # replayed: overwrites the graph's static output
    assert fast.shapes == [(64, D)]
    assert torch.equal(first, kept) and not torch.equal(first, second)
    first.add_(1.0)  # the caller owns it: writing to it is allowed and touches nothing of the graph
    assert torch.equal(fast(_rows(64, 2)), second)


@cuda
def test_cache_bound_and_lru_order():
    cal = CALIBRATORS["flow"]
    eager = cal.torch_transform("cuda")
    fast = graphed_transform(cal.torch_transform("cuda"), torch.device("cuda:0"), max_graphs=2)
    for rnd in range(3):
        for i, n in enumerate((10, 20, 30, 40)):
            x = _rows(n, 100 * rnd + i)
            assert torch.equal(fast(x), eager(x))
            assert len(fast.shapes) <= 2
    assert fast.shapes == [(30, D), (40, D)]
    fast(_rows(30, 999))  # a hit moves the shape to the most recent end
    assert fast.shapes == [(40, D), (30, D)]


@cuda
def test_inputs_a_graph_cannot_take_run_eagerly():
    cal = CALIBRATORS["whitening"]
    eager = cal.torch_transform("cuda")
    fast = graphed_transform(cal.torch_transform("cuda"), torch.device("cuda:0"))
    empty = torch.empty(0, D, device="cuda")
    assert fast(empty).shape == eager(empty).shape
    x = _rows(32, 0).requires_grad_()
    for _ in range(3):
        out = fast(x)
        assert out.requires_grad and torch.equal(out.detach(), eager(x).detach())
    on_cpu = torch.randn(8, D)
    cpu_fast = graphed_transform(cal.torch_transform("cpu"), torch.device("cuda:0"))
    assert torch.equal(cpu_fast(on_cpu), cal.torch_transform("cpu")(on_cpu))
    assert fast.shapes == [] and cpu_fast.shapes == []


@cuda
def test_memoised_per_calibrator_until_refit():
    X = _data()
    cal = WhiteningCalibrator().fit(X)
    a = fast_torch_transform(cal, "cuda")
    assert isinstance(a, GraphedFunction)
    assert fast_torch_transform(cal, "cuda") is a  # Embedder asks once per encode: the graphs are reused
    x = _rows(100, 0)
    before = a(x)
    cal.fit(_data(seed=5))  # a new fit: new fitted state, so a new transform
    b = fast_torch_transform(cal, "cuda")
    assert b is not a
    assert torch.equal(b(x), cal.torch_transform("cuda")(x)) and not torch.equal(b(x), before)


@cuda
def test_numpy_transforms_are_not_graphed():
    cal = _ViaNumpy().fit(_data())
    fast = fast_torch_transform(cal, "cuda")
    assert not isinstance(fast, GraphedFunction)
    x = _rows(16, 0)
    assert torch.equal(fast(x), cal.torch_transform("cuda")(x))


@cuda
def test_threads_get_their_own_results():
    cal = CALIBRATORS["flow"]
    eager = cal.torch_transform("cuda")
    fast = graphed_transform(cal.torch_transform("cuda"), torch.device("cuda:0"))
    fast(_rows(512, 0))
    fast(_rows(512, 1))  # captured
    inputs = [_rows(512, 10 + i) for i in range(8)]
    wanted = [eager(x) for x in inputs]
    results: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        for _ in range(20):
            results[i] = fast(inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for i, want in enumerate(wanted):
        assert torch.equal(results[i], want)


@cuda
def test_encoder_with_the_fast_transform_matches_the_eager_one(tiny_model_dir):
    from bertflow.encoding.encoder import SentenceEncoder

    from ..conftest import SENTENCES

    enc = SentenceEncoder(str(tiny_model_dir), device="cuda", dtype="float32")
    sentences = [f"{s} {i}" for i in range(625) for s in SENTENCES]  # chunks of 4,096 and 904 rows
    cal = FlowCalibrator(max_steps=20, device="cpu").fit(enc.encode(sentences))
    eager = cal.torch_transform(enc.device)
    fast = fast_torch_transform(cal, enc.device)
    for _ in range(3):
        a = enc.encode(sentences, transform=eager)
        b = enc.encode(sentences, transform=fast)
        np.testing.assert_array_equal(a, b)
    assert sorted(fast.shapes) == [(904, enc.dim), (4096, enc.dim)]
