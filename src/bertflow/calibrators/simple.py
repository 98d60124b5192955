"""The simple calibrators of the BERT-flow paper's Table 5: identity, standard-norm, all-but-the-top (NATSV)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..typing import TorchTransform
from .base import Calibrator, as_tensor, check_latents, expect_shape
from .registry import register


def floored_std(std: np.ndarray) -> np.ndarray:
    """Per-dimension std floored at 1e-3 x the median std (and 1e-12): all-MiniLM-L6-v2 has constant dimensions,
    whose std (0 or 1e-9) would turn rounding noise into huge values."""
    floor = max(1e-12, 1e-3 * float(np.median(std)))
    return np.maximum(std, floor)


@register("identity")
class IdentityCalibrator(Calibrator):
    """No calibration ("raw"): returns the embeddings unchanged. Useful as a baseline in the same pipeline."""

    specs = {"none": "no calibration (raw embeddings)"}
    aliases = {"raw": "none", "identity": "none"}
    affine = True
    _needs_variance = False
    _one_to_one = True  # output column i is input column i transformed

    def min_rows(self) -> int:
        return 1

    def _fit(self, X: np.ndarray) -> None:
        pass

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return X

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        return lambda x: x

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Identity."""
        return check_latents(self, Z).astype(np.float32)

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {}

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        pass


@register("standard-norm")
class StandardNormCalibrator(Calibrator):
    """Standard normalisation ("SN" in the BERT-flow paper): per-dimension z-score.

    This is ``sklearn.preprocessing.StandardScaler()`` (population std, ddof 0), except that a (near-)constant
    dimension is divided by a floored std (:func:`floored_std`) where StandardScaler divides by 1; the output is
    float32 (``tests/calibrators/test_simple.py`` checks it). Fitted: ``mean_`` [D] and ``scale_`` [D], the
    floored std.
    """

    specs = {"standard-norm": "per-dimension z-score (SN)"}
    aliases = {"sn": "standard-norm"}
    affine = True
    rescales_variance = True
    _one_to_one = True  # output column i is input column i transformed

    def _fit(self, X: np.ndarray) -> None:
        self.mean_ = X.mean(axis=0)
        self.scale_ = floored_std(X.std(axis=0))

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean_) / self.scale_

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        mean, scale = as_tensor(self.mean_, device), as_tensor(self.scale_, device)
        return lambda x: (x - mean) / scale

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Undo the z-score."""
        return (check_latents(self, Z) * self.scale_ + self.mean_).astype(np.float32)

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {"mean": self.mean_, "scale": self.scale_}

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.mean_ = expect_shape(arrays, "mean", (self.n_features_in_,)).astype(np.float64)
        self.scale_ = expect_shape(arrays, "scale", self.mean_.shape).astype(np.float64)


@register("all-but-the-top")
class AllButTheTopCalibrator(Calibrator):
    """All-but-the-top (Mu & Viswanath 2018; "NATSV" in the BERT-flow paper): centre, then null the top-k
    principal directions (``n_components``; the paper tries 1 to 10), which in raw transformer embeddings encode
    word frequency rather than meaning. Fitted: ``mean_`` [D] and ``components_`` [k, D], the orthonormal
    directions projected out.
    """

    specs = {"natsv-K": "all-but-the-top: null the top K principal directions (NATSV)"}
    aliases = {"abtt": "natsv", "all-but-the-top": "natsv"}
    affine = True
    _one_to_one = True  # output column i is input column i transformed

    def __init__(self, n_components: int = 1) -> None:
        self.n_components = n_components

    def _validate_params(self, X: np.ndarray) -> None:
        n, d = X.shape
        if not 1 <= int(self.n_components) < d:
            raise InputError(
                f"n_components must be between 1 and {d - 1} (n_features={d} minus 1), got {self.n_components}"
            )
        # N centred rows span at most N - 1 directions: removing that many leaves nothing (every output 0, every
        # cosine noise), and more would not even exist (the saved components would not match the declared count).
        if n and int(self.n_components) > n - 2:
            raise InputError(
                f"all-but-the-top with n_components={self.n_components} needs at least {int(self.n_components) + 2} "
                f"sentences (N sentences span N - 1 directions, and some must remain), got {n}"
            )

    def _fit(self, X: np.ndarray) -> None:
        self.mean_ = X.mean(axis=0)
        _, _, vt = np.linalg.svd(X - self.mean_, full_matrices=False)
        self.components_ = vt[: int(self.n_components)]

    def _transform(self, X: np.ndarray) -> np.ndarray:
        centred = X - self.mean_
        return centred - (centred @ self.components_.T) @ self.components_

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        mean, components = as_tensor(self.mean_, device), as_tensor(self.components_, device)

        def project_out(x: torch.Tensor) -> torch.Tensor:
            centred = x - mean
            return centred - (centred @ components.T) @ components

        return project_out

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {"mean": self.mean_, "components": self.components_}

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.mean_ = expect_shape(arrays, "mean", (self.n_features_in_,)).astype(np.float64)
        k = int(self.n_components)
        self.components_ = expect_shape(arrays, "components", (k, self.mean_.shape[0])).astype(np.float64)
