"""Permutations and the LU linear map (bertflow.flows.permutation) beyond the shared transform properties
(test_base.py)."""

from __future__ import annotations

import torch

from bertflow.flows import InvertibleLinearLU, RandomPermutation, ReversePermutation

from .test_base import _ready, make_data


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
