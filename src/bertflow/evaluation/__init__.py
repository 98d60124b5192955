"""Evaluation of sentence embeddings: STS correlation metrics under the "all" and "wmean" protocols.

Submodules: :mod:`~bertflow.evaluation.sts` (metrics), :mod:`~bertflow.evaluation.datasets` (the task records),
:mod:`~bertflow.evaluation.cache` (embedding cache, one-pass multi-pooling encoding), :mod:`~bertflow.evaluation.grid` (``bertflow evaluate`` and
``bertflow reproduce``; fitting :mod:`~bertflow.evaluation.regimes`, :mod:`~bertflow.evaluation.results` and their
Markdown :mod:`~bertflow.evaluation.render`), :mod:`~bertflow.evaluation.perset` (every set scored alone, fitted on
its own sentences) with :mod:`~bertflow.evaluation.lodo` (leave-one-dataset-out selection),
:mod:`~bertflow.evaluation.analyze` (``bertflow analyze``) and :mod:`~bertflow.evaluation.paper` (published numbers).
Their main names are importable from here too; they load on first use, so ``import bertflow.evaluation`` (and the
CLI, which reads the task names) stays light: the metrics need scipy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bertflow.evaluation.sts import (
        EmbedFn,
        Metric,
        Protocol,
        StsReport,
        SubsetScore,
        TaskScore,
        correlations,
        cosine_scores,
        evaluate_pairs,
        evaluate_sts,
        evaluate_task,
    )

_LAZY = {
    **dict.fromkeys(
        (
            "EmbedFn",
            "Metric",
            "Protocol",
            "StsReport",
            "SubsetScore",
            "TaskScore",
            "correlations",
            "cosine_scores",
            "evaluate_pairs",
            "evaluate_sts",
            "evaluate_task",
        ),
        "sts",
    ),
    "EmbeddingCache": "cache",
    "embed_cached": "cache",
    "encode_poolings": "cache",
    "GridConfig": "grid",
    "GridResult": "results",
    "run_grid": "grid",
    "evaluate_embedder": "grid",
    "run_per_set": "perset",
    "PerSetResult": "results",
    "select_lodo": "lodo",
    "analyze_stsb": "analyze",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    # Lazy: the metrics need scipy, the others torch and transformers.
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
