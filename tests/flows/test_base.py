"""Property tests shared by every transform of bertflow.flows (the Transform contract of flows/base.py), and Composite.
Per-layer checks are in test_actnorm.py, test_permutation.py, test_coupling.py and test_glow.py.

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
from bertflow.flows.actnorm import initialize_actnorms

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


# ------------------------------------------------------------------------------------------- Composite


def test_composite_sums_and_reverses() -> None:
    a, b = _ready(ActNorm(4), 4), _ready(AffineCoupling(4, 8), 4)
    comp = Composite(a, b)
    x = make_data(4, n=5)
    y, ladj = comp(x)
    ya, la = a(x)
    yb, lb = b(ya)
    torch.testing.assert_close(y, yb, rtol=0, atol=0)
    torch.testing.assert_close(ladj, la + lb, rtol=1e-12, atol=1e-12)
    assert list(comp.transforms) == [a, b]
    with pytest.raises(TypeError):
        Composite(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
