"""A chain of calibrators applied in order (e.g. standard-norm then all-but-the-top, the paper's Table 5)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.base import OneToOneFeatureMixin, clone

from ..errors import InputError
from ..typing import TorchTransform
from .base import Calibrator, check_latents
from .registry import register


@register("chain")
class ChainCalibrator(Calibrator):
    """Fit and apply ``steps`` one after another, each fitted on the previous one's output. As scikit-learn's
    meta-estimators, ``fit`` fits clones of them (``steps_``), so the calibrators passed in stay unfitted.

    Example:
        >>> ChainCalibrator([StandardNormCalibrator(), AllButTheTopCalibrator(6)])  # "SN + NATSV k=6"
    """

    rescales_variance = True

    def __init__(self, steps: Sequence[Calibrator] = ()) -> None:
        self.steps = steps

    def is_affine(self) -> bool:
        """Affine when every fitted step is (their composition is then one affine map)."""
        self.check_fitted()
        return all(step.is_affine() for step in self.steps_)

    def _validate_params(self, X: np.ndarray) -> None:
        if not self.steps or not all(isinstance(s, Calibrator) for s in self.steps):
            raise InputError("a chain needs at least one step, each a Calibrator instance")

    def _fit(self, X: np.ndarray) -> None:
        # Intermediate results stay float64; the public transform would round each step to float32.
        fitted = []
        for step in self.steps:
            step = clone(step).fit(X)
            fitted.append(step)
            X = step._transform(X)
        self.steps_ = fitted

    def _transform(self, X: np.ndarray) -> np.ndarray:
        for step in self.steps_:
            X = step._transform(X)
        return X

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        parts = [step._torch_transform(device) for step in self.steps_]
        return lambda x: functools.reduce(lambda y, part: part(y), parts, x)

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Invert every step in reverse order; only where every step is invertible."""
        Z = check_latents(self, Z)
        for step in reversed(self.steps_):
            if not hasattr(step, "inverse_transform"):
                raise NotImplementedError(f"{type(step).__name__} in this chain has no inverse")
            Z = step.inverse_transform(Z)
        return np.asarray(Z, dtype=np.float32)

    @property
    def n_features_out_(self) -> int:
        self.check_fitted()
        return self.steps_[-1].n_features_out_

    def get_feature_names_out(self, input_features: Sequence[str] | None = None) -> np.ndarray:
        """Each step's output names fed to the next, as in ``sklearn.pipeline.Pipeline``."""
        self.check_fitted()
        names = OneToOneFeatureMixin.get_feature_names_out(self, input_features)
        for step in self.steps_:
            names = step.get_feature_names_out(names)
        return names

    def to_config(self) -> dict[str, Any]:
        config = super().to_config()
        config["params"] = {}  # the steps travel in "state", as full configs of their own
        return config

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays = {}
        for i, step in enumerate(self.steps_):
            _, step_arrays = step._get_state()
            arrays.update({f"{i}.{k}": v for k, v in step_arrays.items()})
        return {"steps": [step.to_config() for step in self.steps_]}, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        steps = []
        for i, config in enumerate(meta["steps"]):
            prefix = f"{i}."
            sub = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            steps.append(Calibrator.from_config(config, sub))
        self.steps_ = steps
        self.steps = [clone(step) for step in steps]  # the parameter: the same calibrators, unfitted
