"""Small numeric helpers shared by the calibrators, the pipeline and the evaluation."""

from __future__ import annotations

import numpy as np


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` [N, D] scaled to unit L2 norm, as float64; zero rows stay zero. Each row is first divided by
    its largest absolute value, so the norm's squares neither overflow nor underflow (cosine is scale-invariant)."""
    x = np.asarray(x, dtype=np.float64)
    peak = np.abs(x).max(axis=1, keepdims=True) if x.shape[1] else np.zeros((x.shape[0], 1))
    scaled = np.divide(x, peak, out=np.zeros_like(x), where=peak > 0)
    norm = np.linalg.norm(scaled, axis=1, keepdims=True)
    return np.divide(scaled, norm, out=np.zeros_like(scaled), where=norm > 0)


def pair_cosines(za: np.ndarray, zb: np.ndarray) -> np.ndarray:
    """Cosine of each pair of rows of two [N, D] matrices, computed in float64: float32 [N]."""
    return (unit_rows(za) * unit_rows(zb)).sum(axis=1).astype(np.float32)
