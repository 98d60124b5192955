"""The reusable STS evaluator: correlation metrics under the "all" and "wmean" protocols and the data they read.

The metrics' names are importable from here too; they load on first use, so ``import bertflow.evaluation`` (and
the CLI, which reads the task names) stays light: the metrics need scipy.
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
    **dict.fromkeys(("EmbedFn", "Metric", "Protocol", "StsReport", "SubsetScore", "TaskScore", "correlations",
                     "cosine_scores", "evaluate_pairs", "evaluate_sts", "evaluate_task"), "sts"),
    "EmbeddingCache": "cache",
    "embed_cached": "cache",
}  # fmt: skip

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    # Lazy: the metrics need scipy, the others torch and transformers.
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
