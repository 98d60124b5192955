"""FlowTrainer, the public seam of flow fitting: its steps compose into FlowCalibrator.fit, and its reduce hook has the
contract distributed fitting relies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertflow import FlowCalibrator, InputError
from bertflow.calibrators.flow_trainer import FlowFit, FlowTrainer

CONFIG = {"max_steps": 40, "validation_fraction": 0.2, "eval_every": 10, "batch_size": 48, "device": "cpu"}


def _prepared(cal: FlowCalibrator, X: np.ndarray, **kwargs: object) -> tuple[FlowTrainer, torch.Tensor]:
    """A trainer through prepare / build / split / initialize on X, and X as a float32 tensor."""
    trainer = FlowTrainer(cal, **kwargs)
    x = torch.from_numpy(X.astype(np.float32))
    trainer.prepare(x.double().mean(0).numpy(), x.double().std(0, unbiased=False).numpy(), float(x.abs().max()), len(x))
    trainer.build()
    return trainer, x


def test_steps_driven_one_by_one_reproduce_fit(anisotropic_data):
    """A caller's own loop over the public steps (split, index_batches, begin, step, check, observe, finalise)
    fits the same flow, keeps the same best step and records the same held-out scores as ``fit``."""
    ref = FlowCalibrator(**CONFIG).fit(anisotropic_data)
    cal = FlowCalibrator(**CONFIG)
    trainer, x = _prepared(cal, anisotropic_data)
    val_rows, train_rows = trainer.split(len(x))
    assert len(val_rows) == 80 and len(train_rows) == 320
    trainer.initialize(x[train_rows[: cal.init_samples]])
    total = trainer.begin(len(train_rows))
    assert total == 40
    batches = trainer.index_batches(len(train_rows))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run() does on CPU: intra-op threads only slow these tiny matrices down
    try:
        for k in range(1, total + 1):
            loss = trainer.step(x[train_rows[next(batches)]])
            assert loss.ndim == 0
            if k % cal.eval_every == 0:
                trainer.check(k)
                trainer.observe(k, FlowTrainer.mean_bits_per_dim(trainer.glow, x[val_rows]))
    finally:
        torch.set_num_threads(threads)
    result = trainer.finalise()
    assert isinstance(result, FlowFit) and not cal.is_fitted  # the trainer never writes onto the calibrator
    cal.fit_from_result(result, anisotropic_data.shape[1])

    assert cal.history_["val_step"] == ref.history_["val_step"] == [10, 20, 30, 40]
    np.testing.assert_allclose(cal.history_["val_bpd"], ref.history_["val_bpd"], rtol=1e-5)
    assert cal.best_step_ == ref.best_step_ == result.best_step
    assert cal.n_steps_ == ref.n_steps_ == 40
    np.testing.assert_allclose(cal.transform(anisotropic_data), ref.transform(anisotropic_data), atol=1e-4)


def test_reduce_hook_sees_the_global_batch_loss_term(anisotropic_data):
    """With one process the all-reduce is the identity: a reduce hook that returns this process's loss term
    unchanged must train the flow that ``fit`` trains (the term is the rows' sum / global batch size, so its
    gradients are those of the batch mean)."""
    ref = FlowCalibrator(**CONFIG).fit(anisotropic_data)
    seen: list[float] = []

    def identity(glow: torch.nn.Module, local: torch.Tensor) -> torch.Tensor:
        seen.append(float(local))
        return local

    cal = FlowCalibrator(**CONFIG)
    trainer, x = _prepared(cal, anisotropic_data, reduce=identity)
    val_rows, train_rows = trainer.split(len(x))
    trainer.initialize(x[train_rows[: cal.init_samples]])
    batches = (x[train_rows[idx]] for idx in trainer.index_batches(len(train_rows)))
    result = trainer.run(
        batches, len(train_rows), evaluate=lambda glow: FlowTrainer.mean_bits_per_dim(glow, x[val_rows])
    )
    cal.fit_from_result(result, anisotropic_data.shape[1])

    assert len(seen) == 40
    assert cal.best_step_ == ref.best_step_
    np.testing.assert_allclose(cal.history_["train_bpd"], ref.history_["train_bpd"], rtol=1e-5)
    np.testing.assert_allclose(cal.transform(anisotropic_data), ref.transform(anisotropic_data), atol=1e-4)


def test_check_input_refuses_before_any_work(anisotropic_data):
    trainer = FlowTrainer(FlowCalibrator())
    with pytest.raises(InputError, match="at least 32 rows, got 10"):
        trainer.check_input(10, 12)
    with pytest.raises(InputError, match="at least 2 features"):
        trainer.check_input(100, 1)
    with pytest.raises(InputError, match="lr and batch_size must be positive"):
        FlowTrainer(FlowCalibrator(batch_size=0)).check_input(100, 12)


def test_all_constant_dimensions_are_refused_by_prepare():
    trainer = FlowTrainer(FlowCalibrator(device="cpu"))
    std = np.zeros(8)
    std[3] = 1.0
    with pytest.raises(InputError, match="only 1 of 8 embedding dimensions vary across the 50 rows"):
        trainer.prepare(np.zeros(8), std, 1.0, 50)


def test_fit_from_result_refuses_another_width(anisotropic_data):
    """A result covers the dimensions the trainer prepared; assigning it to another width is refused, and the
    calibrator stays unfitted."""
    cal = FlowCalibrator(**CONFIG)
    trainer, x = _prepared(cal, anisotropic_data)
    val_rows, train_rows = trainer.split(len(x))
    trainer.initialize(x[train_rows[: cal.init_samples]])
    result = trainer.run((x[train_rows[idx]] for idx in trainer.index_batches(len(train_rows))), len(train_rows))
    with pytest.raises(InputError, match="covers 12 dimensions, not the 13"):
        cal.fit_from_result(result, 13)
    assert not cal.is_fitted
