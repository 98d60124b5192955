"""Property tests shared by every transform of bertflow.flows, plus per-layer checks.

Every transform (each layer alone, a flow step, whole Glows) is built in float64 at small D, made non-trivial
(data-initialised ActNorms, random non-zero weights everywhere) and checked for: shape, exact inversion,
opposite log-determinants, and agreement of the log-determinant with the autograd Jacobian.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from bertflow.flows import (
    ActNorm,
    AdditiveCoupling,
    AffineCoupling,
    Composite,
    FlowStep,
    Glow,
    InvertibleLinearLU,
    RandomPermutation,
    ReversePermutation,
    Transform,
)
from bertflow.flows.actnorm import data_init_mode, initialize_actnorms
from bertflow.flows.coupling import CouplingNet, ZeroLinear, coupling_network

__all__: list[str] = []

DIMS = [8, 9, 12]


def make_data(d: int, n: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64) -> Tensor:
    """Correlated, shifted, unevenly scaled Gaussian data, shape ``[n, d]``."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(d, d, generator=gen, dtype=torch.float64)
    mix = torch.eye(d, dtype=torch.float64) + noise / math.sqrt(d)
    scales = torch.logspace(-1, 1, d, dtype=torch.float64)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) @ mix * scales + 0.5
    return x.to(dtype)


@torch.no_grad()
def perturb_(module: torch.nn.Module, scale: float = 0.1, seed: int = 1) -> None:
    """Adds seeded Gaussian noise to every parameter, so zero-initialised layers stop being the identity."""
    gen = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.add_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))


def _ready(t: Transform, d: int) -> Transform:
    """float64, all weights perturbed, then ActNorms data-initialised (which keeps activations O(1))."""
    t = t.double()
    perturb_(t)
    initialize_actnorms(t, make_data(d))
    return t


TRANSFORMS: dict[str, Callable[[int], Transform]] = {
    "actnorm": lambda d: _ready(ActNorm(d), d),
    "reverse": lambda d: ReversePermutation(d).double(),
    "random": lambda d: RandomPermutation(d, seed=3).double(),
    "lu": lambda d: _ready(InvertibleLinearLU(d, seed=3), d),
    "additive": lambda d: _ready(AdditiveCoupling(d, hidden=16), d),
    "affine": lambda d: _ready(AffineCoupling(d, hidden=16), d),
    "composite": lambda d: _ready(Composite(ActNorm(d), RandomPermutation(d, 1), AffineCoupling(d, 8)), d),
    "step-additive-reverse": lambda d: _ready(FlowStep(d, 16, "additive", "reverse", seed=5), d),
    "step-affine-lu": lambda d: _ready(FlowStep(d, 16, "affine", "lu", seed=5), d),
    **{
        f"glow-{c}-{p}": (lambda d, c=c, p=p: _ready(Glow(d, 3, 2, 16, c, p, seed=7), d))
        for c in ("additive", "affine")
        for p in ("reverse", "random", "lu")
    },
    "glow-preset-code": lambda d: _ready(Glow.from_preset("code", d, hidden_channels=16), d),
    "glow-preset-paper": lambda d: _ready(Glow.from_preset("paper", d, hidden_channels=16), d),
}


@functools.cache
def built(name: str, d: int) -> Transform:
    """One shared instance per (transform, D): the property tests below only read it."""
    return TRANSFORMS[name](d)


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_roundtrip_and_opposite_ladj(name: str, d: int) -> None:
    t = built(name, d)
    x = make_data(d, n=16, seed=11)
    y, ladj = t(x)
    assert y.shape == x.shape and y.dtype == torch.float64
    assert ladj.shape == (16,)
    assert not torch.allclose(y, x), "transform is the identity: the test would prove nothing"
    x_back, ladj_inv = t.inverse(y)
    assert x_back.shape == x.shape and ladj_inv.shape == (16,)
    torch.testing.assert_close(x_back, x, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ladj + ladj_inv, torch.zeros_like(ladj), rtol=0, atol=1e-10)


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_ladj_matches_autograd_jacobian(name: str, d: int) -> None:
    # The inverse's log-det needs no separate check: it is minus this one (test above).
    t = built(name, d)
    x = make_data(d, n=3, seed=12)
    _, ladj = t(x)
    jac = torch.autograd.functional.jacobian(lambda v: t(v.unsqueeze(0))[0].squeeze(0), x[1], vectorize=True)
    assert jac.shape == (d, d)
    torch.testing.assert_close(ladj[1], torch.linalg.slogdet(jac).logabsdet, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_rows_are_independent(name: str) -> None:
    # A batch must give the same result as its rows one at a time (no sample mixing, no batch-size paths
    # that disagree).
    d = 9
    t = built(name, d)
    x = make_data(d, n=12, seed=13)
    y, ladj = t(x)
    for i in (0, 7):
        yi, li = t(x[i : i + 1])
        torch.testing.assert_close(yi[0], y[i], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(li[0], ladj[i], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------------- ActNorm


def test_actnorm_starts_as_identity_and_forward_never_initialises() -> None:
    an = ActNorm(5)
    assert not bool(an.initialized)
    assert an.initialized.dtype == torch.bool and "initialized" in an.state_dict()
    x = make_data(5, dtype=torch.float32)
    y, ladj = an(x)
    torch.testing.assert_close(y, x)
    torch.testing.assert_close(ladj, torch.zeros(64))
    assert not bool(an.initialized)
    assert torch.all(an.bias == 0) and torch.all(an.log_scale == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_actnorm_initialize_standardises(dtype: torch.dtype) -> None:
    an = ActNorm(7).to(dtype)
    x = make_data(7, n=500, dtype=dtype) * 30 + 100
    an.initialize(x)
    assert bool(an.initialized)
    assert an.bias.requires_grad and an.bias.grad_fn is None and an.log_scale.grad_fn is None
    y, ladj = an(x)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(y.mean(0), torch.zeros(7, dtype=dtype), rtol=0, atol=tol)
    torch.testing.assert_close(y.std(0, correction=0), torch.ones(7, dtype=dtype), rtol=tol, atol=tol)
    expected = -torch.log(x.double().std(0, correction=0)).sum()
    torch.testing.assert_close(ladj, expected.to(dtype).expand(500), rtol=tol, atol=tol)


def test_actnorm_std_floor_on_near_constant_features() -> None:
    an = ActNorm(6)
    x = make_data(6, n=200, dtype=torch.float64)
    x[:, 1] = 3.0 + 1e-9 * torch.randn(200, dtype=torch.float64)  # near-constant
    x[:, 4] = -2.0  # exactly constant
    std = x.std(0, correction=0)
    floor = max(1e-6, 1e-3 * float(std.median()))
    an.initialize(x)
    scale = torch.exp(3.0 * an.log_scale.detach())
    torch.testing.assert_close(
        scale[[1, 4]].double(), torch.full((2,), 1 / floor, dtype=torch.float64), rtol=1e-5, atol=0
    )
    assert torch.isfinite(scale).all() and scale.max() < 1e4
    y, _ = an(x.float())
    assert torch.isfinite(y).all() and y.abs().max() < 1e3
    # Absolute floor when every feature is constant.
    an2 = ActNorm(3)
    an2.initialize(torch.ones(10, 3))
    torch.testing.assert_close(torch.exp(3.0 * an2.log_scale.detach()), torch.full((3,), 1e6), rtol=1e-5, atol=0)


def test_actnorm_initialize_rejects_bad_batches() -> None:
    an = ActNorm(4)
    with pytest.raises(ValueError, match="at least 2 samples"):
        an.initialize(torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        an.initialize(torch.randn(8, 5))
    bad = torch.randn(8, 4)
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        an.initialize(bad)
    assert not bool(an.initialized)


def test_data_init_mode_is_switched_off_even_on_error() -> None:
    step = FlowStep(6, 8)
    with pytest.raises(ValueError), data_init_mode(step):
        step(torch.randn(1, 6))  # a single row cannot initialise
    assert all(m._data_init is None for m in step.modules() if isinstance(m, ActNorm))
    x = torch.randn(8, 6)
    step(x)
    assert not any(bool(m.initialized) for m in step.modules() if isinstance(m, ActNorm))


# ------------------------------------------------------------------------------------------ permutations


def test_random_permutation_is_seeded_and_stored() -> None:
    a, b, c = RandomPermutation(50, seed=1), RandomPermutation(50, seed=1), RandomPermutation(50, seed=2)
    assert a.perm.dtype == torch.long and "perm" in a.state_dict()
    assert torch.equal(a.perm, b.perm) and not torch.equal(a.perm, c.perm)
    assert torch.equal(torch.sort(a.perm).values, torch.arange(50))
    x = torch.arange(50.0).unsqueeze(0)
    torch.testing.assert_close(a(x)[0], a.perm.float().unsqueeze(0))


def test_reverse_permutation_reverses() -> None:
    x = torch.arange(5.0).unsqueeze(0)
    torch.testing.assert_close(ReversePermutation(5)(x)[0], torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]))


def test_lu_starts_orthogonal_and_masks_hidden_entries() -> None:
    lu = InvertibleLinearLU(10, seed=4).double()
    w = lu.weight().detach()
    torch.testing.assert_close(w @ w.T, torch.eye(10, dtype=torch.float64), rtol=0, atol=1e-6)
    assert abs(float(lu.log_abs_s.detach().sum())) < 1e-5
    assert torch.equal(lu.weight(), InvertibleLinearLU(10, seed=4).double().weight())
    assert not torch.allclose(w, InvertibleLinearLU(10, seed=5).double().weight().detach())
    # Entries outside the strict triangles are masked out: changing them must not change the map.
    x = make_data(10, n=5)
    y_before = lu(x)[0].detach()
    with torch.no_grad():
        lu.lower.add_(torch.triu(torch.ones(10, 10, dtype=torch.float64)))
        lu.upper.add_(torch.tril(torch.ones(10, 10, dtype=torch.float64)))
    torch.testing.assert_close(lu(x)[0].detach(), y_before, rtol=0, atol=0)
    state = lu.state_dict()
    assert {"perm", "sign_s", "lower", "upper", "log_abs_s"} == set(state)


def test_lu_weight_matches_forward_for_large_batches() -> None:
    # Forward applies the LU factors one by one for small batches and the assembled W for large ones.
    lu = _ready(InvertibleLinearLU(6, seed=2), 6)
    x = make_data(6, n=20, seed=3)
    torch.testing.assert_close(lu(x)[0], x @ lu.weight().T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lu(x[:3])[0], x[:3] @ lu.weight().T, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------- coupling


def test_coupling_network_structure_and_zero_output() -> None:
    net = coupling_network(5, 8, hidden=32)
    assert isinstance(net, CouplingNet)
    kinds = [type(m) for m in net.children()]
    assert kinds == [torch.nn.Linear, ActNorm, torch.nn.Linear, ActNorm, ZeroLinear]
    assert net.linear1.bias is None and net.linear2.bias is None
    assert net.norm1.num_features == 32 and net.out.out_features == 8
    for name in ("weight", "bias", "logs"):
        assert torch.all(getattr(net.out, name) == 0)
    assert torch.all(net(torch.randn(4, 5)) == 0)
    # 5*32 + 2*32 + 32*32 + 2*32 + 32*8 + 2*8
    assert sum(p.numel() for p in net.parameters()) == 1584


def test_zero_linear_scales_by_exp_three_logs() -> None:
    layer = ZeroLinear(3, 2).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0, 0.0], [0.0, -1.0, 1.0]]))
        layer.bias.copy_(torch.tensor([0.5, -0.5]))
        layer.logs.copy_(torch.tensor([0.1, -0.2]))
    h = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[3.5 * math.exp(0.3), -0.5 * math.exp(-0.6)]], dtype=torch.float64)
    torch.testing.assert_close(layer(h), expected)


@pytest.mark.parametrize("n", [2, 7, 8])
def test_fresh_couplings_match_their_closed_form(n: int) -> None:
    x = torch.randn(6, n, dtype=torch.float64)
    n_a = n - n // 2
    add = AdditiveCoupling(n).double()
    y, ladj = add(x)
    torch.testing.assert_close(y, x)
    torch.testing.assert_close(ladj, torch.zeros(6, dtype=torch.float64))
    aff = AffineCoupling(n).double()
    y, ladj = aff(x)
    torch.testing.assert_close(y[:, :n_a], x[:, :n_a], rtol=0, atol=0)
    torch.testing.assert_close(y[:, n_a:], x[:, n_a:] * torch.sigmoid(torch.tensor(2.0, dtype=torch.float64)))
    expected = (n // 2) * torch.nn.functional.logsigmoid(torch.tensor(2.0, dtype=torch.float64))
    torch.testing.assert_close(ladj, expected.expand(6))


@pytest.mark.parametrize("cls", [AdditiveCoupling, AffineCoupling])
def test_coupling_passes_first_part_through(cls: type[Transform]) -> None:
    t = _ready(cls(9, hidden=8), 9)
    x = make_data(9, n=10, seed=5)
    y, _ = t(x)
    torch.testing.assert_close(y[:, :5], x[:, :5], rtol=0, atol=0)
    assert not torch.allclose(y[:, 5:], x[:, 5:])


def test_affine_ladj_is_nonzero_and_data_dependent_after_perturbation() -> None:
    t = _ready(AffineCoupling(8, hidden=8), 8)
    _, ladj = t(make_data(8, n=10, seed=6))
    assert torch.all(ladj != 0)
    assert float(ladj.detach().std()) > 1e-3


@pytest.mark.parametrize("cls", [AdditiveCoupling, AffineCoupling])
def test_coupling_rejects_single_feature(cls: type[Transform]) -> None:
    with pytest.raises(ValueError, match="at least 2 features"):
        cls(1)


def test_composite_sums_and_reverses() -> None:
    a, b = _ready(ActNorm(4), 4), _ready(AffineCoupling(4, 8), 4)
    comp = Composite(a, b)
    x = make_data(4, n=5)
    y, ladj = comp(x)
    ya, la = a(x)
    yb, lb = b(ya)
    torch.testing.assert_close(y, yb, rtol=0, atol=0)
    torch.testing.assert_close(ladj, la + lb, rtol=1e-12, atol=1e-12)
    assert len(comp) == 2 and comp[1] is b
    with pytest.raises(TypeError):
        Composite(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
