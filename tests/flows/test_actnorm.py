"""ActNorm (bertflow.flows.actnorm) beyond the shared transform properties (test_base.py): identity start, data
initialisation, the std floor, and initialize_actnorms' init mode."""

from __future__ import annotations

import pytest
import torch

from bertflow.flows import ActNorm, FlowStep
from bertflow.flows.actnorm import initialize_actnorms

from .test_base import make_data


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


def test_init_mode_is_switched_off_even_on_error() -> None:
    step = FlowStep(6, 8)
    with pytest.raises(ValueError):
        initialize_actnorms(step, torch.randn(1, 6))  # a single row cannot initialise
    assert all(m._data_init is None for m in step.modules() if isinstance(m, ActNorm))
    x = torch.randn(8, 6)
    step(x)
    assert not any(bool(m.initialized) for m in step.modules() if isinstance(m, ActNorm))
