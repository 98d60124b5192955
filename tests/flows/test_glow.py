"""Tests of the multi-scale Glow: density, gradients, initialisation, persistence, config and training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from bertflow.flows import GLOW_PRESETS, ActNorm, Glow

from .test_base import make_data, perturb_

__all__: list[str] = []

COMBOS = [(c, p) for c in ("additive", "affine") for p in ("reverse", "random", "lu")]


def _ready_glow(d: int = 12, dtype: torch.dtype = torch.float64, **kwargs: object) -> Glow:
    cfg: dict = {"n_levels": 3, "depth": 2, "hidden_channels": 16, **kwargs}
    glow = Glow(d, **cfg).to(dtype)
    perturb_(glow)
    glow.initialize(make_data(d, n=128, dtype=dtype))
    return glow


def _actnorms(glow: Glow) -> list[ActNorm]:
    return [m for m in glow.modules() if isinstance(m, ActNorm)]


# ------------------------------------------------------------------------------------------------ density


@pytest.mark.parametrize(("coupling", "permutation"), COMBOS)
def test_log_prob_is_normal_density_of_latent_plus_ladj(coupling: str, permutation: str) -> None:
    glow = _ready_glow(coupling=coupling, permutation=permutation)
    x = make_data(12, n=10, seed=3)
    lp = glow.log_prob(x)
    assert lp.shape == (10,) and lp.requires_grad
    z, ladj = glow(x)
    expected = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(1) + ladj
    torch.testing.assert_close(lp, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(glow.bits_per_dim(x), -lp / (12 * math.log(2)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("coupling", "permutation"), COMBOS)
def test_every_parameter_gets_a_gradient(coupling: str, permutation: str) -> None:
    glow = Glow(9, n_levels=2, depth=2, hidden_channels=8, coupling=coupling, permutation=permutation)
    glow.initialize(make_data(9, dtype=torch.float32))
    loss = glow.bits_per_dim(make_data(9, n=16, seed=4, dtype=torch.float32)).mean()
    loss.backward()
    # Not asserting non-zero: the zero-initialised last layers legitimately give zero grads upstream at
    # step 0.
    missing = [name for name, p in glow.named_parameters() if p.grad is None]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in glow.parameters())  # type: ignore[arg-type]


def test_latent_layout_factors_out_the_tail_of_each_level() -> None:
    glow = _ready_glow(d=12, n_levels=3, depth=1)
    assert glow.level_channels == (12, 6, 3)
    assert glow.latent_sizes == (6, 3, 3)
    x = make_data(12, n=5, seed=5)
    # Rebuild z by hand: level 0 factors out its last 6 channels, level 1 its last 3, level 2 keeps 3.
    h, _ = glow.levels[0](x)
    part0, h = h[:, 6:], h[:, :6]
    h, _ = glow.levels[1](h)
    part1, h = h[:, 3:], h[:, :3]
    h, _ = glow.levels[2](h)
    torch.testing.assert_close(glow(x)[0], torch.cat([part0, part1, h], 1), rtol=0, atol=0)


def test_float32_matches_float64() -> None:
    g64 = _ready_glow(coupling="affine", permutation="lu")
    g32 = Glow(**g64.get_config())
    g32.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in g64.state_dict().items()})
    x = make_data(12, n=8, seed=6)
    lp32 = g32.log_prob(x.float())
    assert lp32.dtype == torch.float32
    torch.testing.assert_close(lp32.double(), g64.log_prob(x), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------- initialisation


def test_initialize_sets_every_actnorm_in_data_order() -> None:
    glow = Glow(10, n_levels=2, depth=2, hidden_channels=8, coupling="affine", permutation="random")
    assert not glow.is_initialized
    x = make_data(10, n=256, seed=7, dtype=torch.float32) * 5 + 3
    glow(x)  # forward must not initialise
    assert not glow.is_initialized
    assert all(torch.all(m.bias == 0) for m in _actnorms(glow))
    # 2 levels x 2 steps x (1 step ActNorm + 2 inside the coupling net)
    assert len(_actnorms(glow)) == 12
    glow.initialize(x)
    assert glow.is_initialized and all(bool(m.initialized) for m in _actnorms(glow))
    assert all(p.grad_fn is None and p.is_leaf for p in glow.parameters())
    # Each ActNorm was set from the activations that actually reach it: its output on x is standardised.
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out[0])) for m in _actnorms(glow)]
    with torch.no_grad():
        glow(x)
    for h in hooks:
        h.remove()
    assert len(seen) == 12
    for out in seen:
        torch.testing.assert_close(out.mean(0), torch.zeros(out.shape[1]), rtol=0, atol=1e-4)
        torch.testing.assert_close(out.std(0, correction=0), torch.ones(out.shape[1]), rtol=0, atol=1e-3)


def _near_constant_sample(n: int, wobble: float, gen: torch.Generator, d: int = 16) -> torch.Tensor:
    """Gaussian data with 3 near-constant columns (std ``wobble``) at various offsets, float64 ``[n, d]``."""
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.logspace(-2, 1, d, dtype=torch.float64)
    offsets = torch.tensor([0.5, -3.0, 10.0], dtype=torch.float64)
    x[:, [2, 7, 11]] = offsets + wobble * torch.randn(n, 3, generator=gen, dtype=torch.float64)
    return x + 1.0


@pytest.mark.parametrize(("coupling", "permutation"), [("additive", "reverse"), ("affine", "lu")])
def test_initialize_survives_near_constant_dimensions(coupling: str, permutation: str) -> None:
    # Real checkpoints have dimensions that barely move; a naive std init would scale them by ~1e9.
    gen = torch.Generator().manual_seed(8)
    glow = Glow.from_preset("code", 16, coupling=coupling, permutation=permutation).double()
    glow.initialize(_near_constant_sample(512, 1e-9, gen))
    # On data like the init batch, and on new data whose constant columns drift by 1e-4. The drift case
    # catches floors that compound over the 9 ActNorms of a feature's path back to a gain of ~1e9.
    for x in (_near_constant_sample(512, 1e-9, gen), _near_constant_sample(64, 1e-4, gen)):
        z, ladj = glow(x)
        assert torch.isfinite(z).all() and torch.isfinite(ladj).all()
        assert z.abs().max() < 1e4
    loss = glow.bits_per_dim(_near_constant_sample(64, 1e-4, gen)).mean()
    loss.backward()
    assert torch.isfinite(loss)
    grad_norm = torch.sqrt(sum(p.grad.square().sum() for p in glow.parameters()))  # type: ignore[union-attr]
    assert torch.isfinite(grad_norm) and grad_norm < 1e4


def test_training_does_not_diverge_with_near_constant_dimensions() -> None:
    gen = torch.Generator().manual_seed(9)
    train = _near_constant_sample(1024, 1e-9, gen).float()  # in float32 the 3 columns are exactly constant
    glow = Glow.from_preset("code", 16)  # additive + reverse keep a constant column constant at init
    glow.initialize(train[:512])
    opt = torch.optim.Adam(glow.parameters(), lr=1e-3)
    batches = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(60):
        loss = glow.bits_per_dim(train[torch.randint(0, 1024, (64,), generator=batches)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # The floored gain (~3e3 here) lets Adam's first, sign-normalised steps cause a transient spike of a few
    # bits/dim; compounded gains instead reach ~1e7 bits/dim and never come back.
    assert all(math.isfinite(v) for v in losses)
    assert max(losses) < 100
    assert sum(losses[-10:]) / 10 < losses[0] + 0.5
    with torch.no_grad():
        assert glow(train)[0].abs().max() < 1e3


def test_initialize_rejects_bad_batches() -> None:
    glow = Glow(8, n_levels=2, depth=1)
    with pytest.raises(ValueError, match=r"\[B, 8\]"):
        glow.initialize(torch.randn(10, 7))
    with pytest.raises(ValueError, match="at least 2 samples"):
        glow.initialize(torch.randn(1, 8))
    with pytest.raises(ValueError, match=r"\[B, 8\]"):
        glow(torch.randn(8))
    assert not glow.is_initialized


# ------------------------------------------------------------------------------------------- persistence


@pytest.mark.parametrize(("coupling", "permutation"), COMBOS)
def test_safetensors_round_trip_is_exact(tmp_path: Path, coupling: str, permutation: str) -> None:
    glow = _ready_glow(coupling=coupling, permutation=permutation, seed=3)
    path = tmp_path / "flow.safetensors"
    save_file(glow.state_dict(), str(path))
    cfg = json.loads(json.dumps(glow.get_config()))
    # A different seed proves the permutation / LU state comes from the file, not from re-drawing it.
    cfg["seed"] = 99
    loaded = Glow(**cfg).double()
    assert not loaded.is_initialized
    loaded.load_state_dict(load_file(str(path)))
    assert loaded.is_initialized
    x = make_data(12, n=9, seed=9)
    z, ladj = glow(x)
    z2, ladj2 = loaded(x)
    torch.testing.assert_close(z2, z, rtol=0, atol=0)
    torch.testing.assert_close(ladj2, ladj, rtol=0, atol=0)
    torch.testing.assert_close(loaded.log_prob(x), glow.log_prob(x), rtol=0, atol=0)
    # Running data through a loaded model (even in large, shifted batches) never re-initialises it.
    before = {k: v.clone() for k, v in loaded.state_dict().items()}
    loaded(make_data(12, n=300, seed=10) * 7 - 4)
    loaded.log_prob(make_data(12, n=5, seed=11))
    after = loaded.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_uninitialised_flag_round_trips_too(tmp_path: Path) -> None:
    glow = Glow(8, n_levels=2, depth=1)
    save_file(glow.state_dict(), str(tmp_path / "f.safetensors"))
    other = Glow(8, n_levels=2, depth=1)
    other.initialize(make_data(8, dtype=torch.float32))
    other.load_state_dict(load_file(str(tmp_path / "f.safetensors")))
    assert not other.is_initialized


@pytest.mark.parametrize("permutation", ["reverse", "random", "lu"])
def test_config_rebuilds_identical_model(permutation: str) -> None:
    glow = Glow(11, n_levels=2, depth=2, hidden_channels=8, coupling="affine", permutation=permutation, seed=5)
    cfg = glow.get_config()
    assert json.loads(json.dumps(cfg)) == cfg
    twin = Glow(**cfg)
    a, b = glow.state_dict(), twin.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if permutation != "reverse":
        other = Glow(**{**cfg, "seed": 6}).state_dict()
        assert any(not torch.equal(a[k], other[k]) for k in a)


# --------------------------------------------------------------------------------------- configuration


def test_rejects_bad_configurations() -> None:
    with pytest.raises(ValueError, match="at least 2 channels"):
        Glow(2, n_levels=3)
    with pytest.raises(ValueError, match=r"n_levels <= 2"):
        Glow(3, n_levels=3)
    with pytest.raises(ValueError, match="unknown coupling 'spline'"):
        Glow(8, coupling="spline")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown permutation 'shuffle'"):
        Glow(8, permutation="shuffle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown Glow preset 'nope'"):
        Glow.from_preset("nope", 8)
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        Glow(8, depth=0)


def test_presets() -> None:
    assert GLOW_PRESETS["code"] == dict(n_levels=3, depth=3, coupling="additive", permutation="reverse")
    assert GLOW_PRESETS["paper"] == dict(n_levels=2, depth=3, coupling="additive", permutation="random")
    paper = Glow.from_preset("paper", 20, seed=4)
    assert paper.get_config() == dict(
        n_features=20,
        n_levels=2,
        depth=3,
        hidden_channels=32,
        coupling="additive",
        permutation="random",
        seed=4,
    )
    assert Glow.from_preset("code", 20, depth=1).depth == 1
    assert GLOW_PRESETS["code"]["depth"] == 3  # overrides must not leak into the shared dict


def test_code_preset_parameter_count_matches_official() -> None:
    glow = Glow.from_preset("code", 768)
    n_params = sum(p.numel() for p in glow.parameters() if p.requires_grad)
    assert abs(n_params - 151_488) / 151_488 < 0.02
    assert n_params == 151_488  # hidden Linears without bias (ActNorm follows) reproduce it exactly


# ---------------------------------------------------------------------------------------------- training


def test_training_lowers_nll_on_correlated_gaussian() -> None:
    d = 16
    gen = torch.Generator().manual_seed(0)
    mix = torch.randn(3, d, generator=gen)
    cov = mix.T @ mix + 0.09 * torch.eye(d)  # rank-3 structure + small isotropic noise
    chol = torch.linalg.cholesky(cov)

    def sample(n: int) -> torch.Tensor:
        return torch.randn(n, d, generator=gen) @ chol.T + 2.0

    train, test = sample(2048), sample(2048)
    entropy = 0.5 * float(torch.logdet(2 * math.pi * math.e * cov.double())) / d  # best possible, nats/dim
    glow = Glow.from_preset("code", d, seed=0)
    glow.initialize(train[:512])
    with torch.no_grad():
        nll_start = -float(glow.log_prob(test).mean()) / d
    opt = torch.optim.Adam(glow.parameters(), lr=1e-3)
    batches = torch.Generator().manual_seed(1)
    for _ in range(250):
        loss = glow.bits_per_dim(train[torch.randint(0, 2048, (64,), generator=batches)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        nll_end = -float(glow.log_prob(test).mean()) / d
    # ActNorm init only captures the marginals; the couplings must learn the correlations.
    assert nll_start - entropy > 0.5
    assert nll_end < nll_start - 0.6 * (nll_start - entropy)
    # A held-out cross-entropy cannot beat the true entropy: catches a log-det with the wrong sign.
    assert nll_end > entropy - 0.02


# -------------------------------------------------------------------------------------------- hypothesis


def _max_levels(d: int) -> int:
    levels, c = 0, d
    while c >= 2:
        levels, c = levels + 1, c - c // 2
    return levels


@settings(max_examples=25, deadline=None)
@given(
    d=st.integers(4, 40),
    batch=st.integers(1, 12),
    data=st.data(),
    coupling=st.sampled_from(["additive", "affine"]),
    permutation=st.sampled_from(["reverse", "random", "lu"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_round_trip_property(
    d: int, batch: int, data: st.DataObject, coupling: str, permutation: str, seed: int
) -> None:
    n_levels = data.draw(st.integers(1, min(3, _max_levels(d))), label="n_levels")
    glow = Glow(d, n_levels, 2, 8, coupling, permutation, seed).double()  # type: ignore[arg-type]
    perturb_(glow, seed=seed)
    glow.initialize(make_data(d, n=32, seed=seed))
    x = make_data(d, n=batch, seed=seed + 1)
    z, ladj = glow(x)
    assert z.shape == (batch, d) and ladj.shape == (batch,)
    x_back, ladj_inv = glow.inverse(z)
    torch.testing.assert_close(x_back, x, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ladj + ladj_inv, torch.zeros_like(ladj), rtol=0, atol=1e-9)
