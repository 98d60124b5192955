"""What a fitted model becomes in sentence-transformers' own modules, and why the rest needs bertflow.

``from_embedder(embedder)`` (:mod:`bertflow.integrations.st_export`) writes a folder that loads with plain
``SentenceTransformer(path)`` exactly when built-in modules express both the pooling and the calibrator (an affine
map is a ``Dense``, anchored and auto after a token-averaging pooling a chain of modules); the others are bertflow's
``Calibration`` module. This module holds that knowledge without importing sentence-transformers, so the model
card can state it.
"""

from __future__ import annotations

import numpy as np

from .calibrators import AnchoredWhiteningCalibrator, Calibrator

_FLOW = "a normalizing flow (Glow: non-linear coupling networks), which no sentence-transformers module computes"
_CLS = (
    "not affine: its output [sqrt(1-b) x/|x|, sqrt(b) z/|z|] (z = (x - mean) W) normalises two blocks of one vector "
    "separately, which sentence-transformers' modules do only when x is a mean of token embeddings (the block z/|z| "
    "is then the normalised mean of per-token (h_t - mean) W); with cls pooling x is the first token, which no "
    "module besides Pooling's cls mode selects, and that mode is taken by the other block"
)
_OWN_POOLING = (
    "exported with sentence-transformers' modules only by from_embedder(embedder), which knows the "
    "pooling; fit_calibrator keeps bertflow's Calibration module after the model's own pooling"
)


def anchored_parts(calibrator: Calibrator) -> tuple[np.ndarray, np.ndarray, float] | None:
    """``(mean [D], W [D, k], b)`` of a fitted calibrator whose transform is the anchored mix
    ``[sqrt(1-b) x/|x|, sqrt(b) z/|z|]``, ``z = (x - mean) W`` (anchored whitening, auto); ``None`` for any other
    calibrator."""
    if not isinstance(calibrator, AnchoredWhiteningCalibrator):
        return None
    calibrator.check_fitted()
    return calibrator.mean_, calibrator.components_, float(calibrator.weight_)


def calibrator_needs_bertflow(calibrator: Calibrator, pooling: str | None) -> str | None:
    """``None`` when the fitted ``calibrator`` after ``pooling`` (its bertflow name: ``"mean"``, ``"cls"``,
    ``"sif:first-last-avg"`` ...; ``None`` for a sentence-transformers model's own pooling, ``fit_calibrator``)
    exports as sentence-transformers' own modules (loads without bertflow); else why it is bertflow's
    ``Calibration`` module, in one sentence."""
    if calibrator.is_affine():  # x -> x W + b: a Dense computes it
        return None
    if anchored_parts(calibrator) is not None:
        if pooling is None:
            return f"the `{calibrator.name}` calibrator is {_OWN_POOLING}"
        if pooling.split(":")[-1] == "cls":
            return f"the `{calibrator.name}` calibrator is {_CLS}"
        return None
    reason = _FLOW if calibrator.name == "flow" else "not one affine map"
    return f"the `{calibrator.name}` calibrator is {reason}"
