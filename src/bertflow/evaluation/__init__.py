"""Evaluation of sentence embeddings: STS correlation metrics under the "all" and "wmean" protocols."""

from __future__ import annotations

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

__all__ = [
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
]
