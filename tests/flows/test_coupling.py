"""Couplings and their networks (bertflow.flows.coupling) beyond the shared transform properties (test_base.py)."""

from __future__ import annotations

import math

import pytest
import torch

from bertflow.flows import ActNorm, AdditiveCoupling, AffineCoupling, Transform
from bertflow.flows.coupling import CouplingNet, ZeroLinear

from .test_base import _ready, make_data


def test_coupling_network_structure_and_zero_output() -> None:
    net = CouplingNet(5, 8, hidden=32)
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
