"""FlowCalibrator behaviour beyond the shared contract: likelihood, constant dimensions, divergence, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertflow import DivergenceError, FlowCalibrator, InputError


def test_fitting_raises_likelihood_and_isotropises(anisotropic_data):
    cal = FlowCalibrator(epochs=60, lr=1e-2).fit(anisotropic_data)
    bpd = cal.history_["train_bpd"]
    assert bpd[-1] < bpd[0] - 0.5
    z = cal.transform(anisotropic_data).astype(np.float64)

    def off_diagonal_corr(a: np.ndarray) -> float:
        return float(np.abs(np.corrcoef(a, rowvar=False) - np.eye(a.shape[1])).mean())

    # The input is strongly correlated; the latent is much closer to isotropic.
    assert off_diagonal_corr(anisotropic_data) > 0.2
    assert off_diagonal_corr(z) < 0.5 * off_diagonal_corr(anisotropic_data)
    assert np.abs(z.std(0) - 1).max() < 0.35
    # score is the mean log-density in nats; bits per dimension matches the training objective.
    assert cal.bits_per_dim(anisotropic_data) == pytest.approx(-cal.score(anisotropic_data) / (12 * np.log(2)))


def test_score_samples_is_a_density_that_matches_the_flow(anisotropic_data):
    cal = FlowCalibrator(max_steps=50).fit(anisotropic_data)
    x = torch.from_numpy(anisotropic_data[:, cal._active].astype(np.float32))
    with torch.no_grad():
        expected = cal.flow_.log_prob(x).double().numpy()
    np.testing.assert_allclose(cal.score_samples(anisotropic_data), expected, rtol=1e-5, atol=1e-4)


def test_constant_dimensions_are_set_aside(anisotropic_data):
    x = anisotropic_data.copy()
    x[:, [2, 9]] = 0.25  # exactly constant, like all-MiniLM-L6-v2's dimensions 127/223/319
    x[:, 4] = -1.0 + 1e-9 * np.random.default_rng(0).normal(size=len(x))
    cal = FlowCalibrator(max_steps=60).fit(x)
    assert cal.passthrough_.tolist() == [2, 4, 9]
    z = cal.transform(x)
    assert np.isfinite(z).all() and np.abs(z).max() < 50
    np.testing.assert_allclose(cal.inverse_transform(z), x, atol=1e-4)
    assert np.isfinite(cal.score_samples(x)).all()


def test_same_seed_same_result_other_seed_differs(anisotropic_data):
    a = FlowCalibrator(max_steps=40, seed=3).fit(anisotropic_data)
    b = FlowCalibrator(max_steps=40, seed=3).fit(anisotropic_data)
    c = FlowCalibrator(max_steps=40, seed=4).fit(anisotropic_data)
    for (k, va), vb in zip(a.flow_.state_dict().items(), b.flow_.state_dict().values(), strict=False):
        assert torch.equal(va, vb), k
    np.testing.assert_array_equal(a.transform(anisotropic_data), b.transform(anisotropic_data))
    assert not np.array_equal(a.transform(anisotropic_data), c.transform(anisotropic_data))


def test_divergence_names_the_step_and_keeps_good_parameters(anisotropic_data):
    cal = FlowCalibrator(lr=1e6, max_steps=200, coupling="affine")
    with pytest.raises(DivergenceError, match=r"diverged at step \d+ of 200"):
        cal.fit(anisotropic_data * 1e3)
    for v in cal.flow_.state_dict().values():
        assert torch.isfinite(v.float()).all()


def test_validation_split_picks_the_best_step(anisotropic_data):
    cal = FlowCalibrator(max_steps=120, eval_every=20, validation_fraction=0.2).fit(anisotropic_data)
    h = cal.history_
    assert h["val_step"] == [20, 40, 60, 80, 100, 120]
    assert cal.best_step_ == h["val_step"][int(np.argmin(h["val_bpd"]))]


def test_epochs_give_the_step_count(anisotropic_data):
    assert FlowCalibrator(epochs=1).fit(anisotropic_data).n_steps_ == 7  # ceil(400 / 64)
    assert FlowCalibrator(epochs=0.15, batch_size=20).fit(anisotropic_data).n_steps_ == 3


def test_too_few_rows_is_a_clear_error(anisotropic_data):
    with pytest.raises(InputError, match="at least 32"):
        FlowCalibrator().fit(anisotropic_data[:10])


def test_bad_preset():
    with pytest.raises(InputError, match="unknown flow preset"):
        FlowCalibrator("huge").fit(np.random.default_rng(0).normal(size=(64, 8)))


@pytest.mark.slow
def test_default_model_embeddings_fit_cleanly(default_encoder, data_dir):
    """Real all-MiniLM-L6-v2 embeddings (constant at 127/223/319) on STS16-sized data: finite, no divergence."""
    lines = (data_dir / "STS16" / "headlines.tsv").read_text(encoding="utf-8").split("\n")[1:]
    sentences = sorted({s for line in lines if line for s in line.split("\t")[1:]})
    x = default_encoder.encode(sentences)
    for preset, kwargs in [("code", {}), ("paper", {"coupling": "affine", "permutation": "lu"})]:
        cal = FlowCalibrator(preset, **kwargs).fit(x)
        assert cal.passthrough_.tolist() == [127, 223, 319]
        z = cal.transform(x)
        assert np.isfinite(z).all()
        assert np.isfinite(cal.history_["train_bpd"]).all()
