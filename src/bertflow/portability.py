"""What a fitted model becomes in sentence-transformers' own modules, and why the rest needs bertflow.

``Embedder.to_sentence_transformer()`` (:mod:`bertflow.integrations.sentence_transformers`) writes a
``SentenceTransformer`` folder. It loads with plain ``SentenceTransformer(path)``, without bertflow, exactly when
both the pooling and the calibrator are expressed by sentence-transformers' built-in modules:

* the pooling: ``cls``, ``mean``, layer averages and their sif/usif/idf weightings (``Pooling``,
  ``WeightedLayerPooling``, ``WordWeights``); not ``pooler`` (no module applies BERT's pooler head);
* the calibrator: an affine map ``x -> x W + b`` (identity, standard-norm, all-but-the-top, whitening, chains of
  them) is a ``Dense`` with identity activation. The others are bertflow's ``Calibration`` module, loaded with
  ``trust_remote_code=True`` and bertflow installed; :func:`calibrator_needs_bertflow` says why for each.

This module holds that knowledge without importing sentence-transformers, so the model card can state it.
"""

from __future__ import annotations

from .calibrators import (
    AllButTheTopCalibrator,
    Calibrator,
    ChainCalibrator,
    IdentityCalibrator,
    StandardNormCalibrator,
    WhiteningCalibrator,
)

__all__ = ["calibrator_needs_bertflow", "is_affine"]

# Calibrators whose transform is exactly x -> (x - mean) @ W. Exact types, not isinstance: a subclass may add a
# non-linear step (AutoCalibrator extends the anchored mix, for one).
_AFFINE = (IdentityCalibrator, StandardNormCalibrator, AllButTheTopCalibrator, WhiteningCalibrator)

# Why each non-affine calibrator has no exact equivalent among sentence-transformers 6.2's built-in modules.
_BLOCKWISE = (
    "not affine: its output [sqrt(1-b) x/|x|, sqrt(b) z/|z|] (z = (x - mean) W) normalises two blocks of one "
    "vector separately. In sentence-transformers 6.2, Normalize scales a whole row, LayerNorm standardises a whole "
    "row, Dense adds an element-wise activation, and the one module that concatenates (Pooling with several modes) "
    "joins a sentence vector with a pooling over token embeddings, which cannot take the norm of a pooled vector. "
    "The only construction found (the multi-vector HierarchicalTokenPooling forced to one cluster, which returns "
    "the normalised token mean) runs a Ward clustering per sentence on the CPU, acts only for the tasks it lists "
    "and has no form for cls pooling, so bertflow does not export through it"
)
_REASONS = {
    "flow": "a normalizing flow (Glow: non-linear coupling networks), which no sentence-transformers module computes",
    "anchored": _BLOCKWISE,
    "auto": _BLOCKWISE,
}


def is_affine(calibrator: Calibrator) -> bool:
    """Whether ``calibrator``'s transform is one affine map ``x -> x W + b`` (a ``Dense`` computes it)."""
    if type(calibrator) is ChainCalibrator:
        return all(is_affine(step) for step in calibrator.steps_)
    return type(calibrator) in _AFFINE


def calibrator_needs_bertflow(calibrator: Calibrator) -> str | None:
    """``None`` when the fitted ``calibrator`` exports as sentence-transformers' own ``Dense`` (loads without
    bertflow); else one sentence saying why its export is bertflow's ``Calibration`` module."""
    if is_affine(calibrator):
        return None
    reason = _REASONS.get(calibrator.name, "not one affine map")
    return f"the `{calibrator.name}` calibrator is {reason}"
