"""Fitting regimes of the evaluation grid (:data:`REGIME_TEXT`): which unlabeled sentences each task's calibrator is
fitted on, and how many evaluation sentences that set contains (:func:`seen_counts`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InputError
from ..evaluation.datasets import StsTask

#: Fitting regimes a grid accepts (``none`` is implied by the calibrator ``none``).
REGIMES = ("target", "train", "nli", "corpus")
#: Regimes of the default grid: the paper's transductive default and a generic (NLI) corpus.
DEFAULT_REGIMES = ("target", "nli")

REGIME_TEXT = {
    "none": "no fitting (raw encoder)",
    "target": "per task, all sentences of that task (STS-B/SICK-R train+dev+test; STS12-16 all subsets); "
    "transductive, the paper's default",
    "train": "per task, train split only (STS-B, SICK-R); STS12-16 have none: n/a",
    "nli": "one fit on the SNLI dev+test sentences (25.7k distinct; a stand-in for the paper's full SNLI+MNLI)",
    "corpus": "one fit on a user corpus",
}


@dataclass
class FittingSets:
    """The unlabeled sentences a ``regime`` (``"none"``, ``"target"``, ``"train"``, ``"nli"``, ``"corpus"``) fits on:
    ``per_task`` fitting sentences (``None`` where the regime does not apply: the train split of STS12-16; the same
    list for every task where one fit serves them all, ``shared``: nli, corpus) and a ``description`` for reports."""

    regime: str
    per_task: dict[str, list[str] | None]
    shared: bool
    description: str


def fitting_sets(
    regime: str,
    tasks: Mapping[str, StsTask],
    *,
    nli: Sequence[str] | None = None,
    corpus: Sequence[str] | None = None,
    corpus_name: str | None = None,
) -> FittingSets:
    """Which sentences each task's calibrator is fitted on under ``regime`` (``"none"`` or one of :data:`REGIMES`);
    ``nli`` and ``corpus`` are the sentences of those regimes, ``corpus_name`` names the corpus in reports.
    InputError for an unknown regime or missing sentences."""
    text = REGIME_TEXT.get(regime, "")
    if regime == "none":
        return FittingSets("none", {t: [] for t in tasks}, True, text)
    if regime in ("target", "train"):  # STS12-16 have no train split: n/a there
        per = {t: task.fit_sentences(regime) if regime == "target" or task.has_train_split else None
               for t, task in tasks.items()}  # fmt: skip
        return FittingSets(regime, per, False, text)
    if regime in ("nli", "corpus"):
        shared = nli if regime == "nli" else corpus
        if not shared:
            raise InputError(
                "the corpus regime needs a corpus file (--corpus FILE)" if regime == "corpus" else "no NLI sentences"
            )
        text += f" {corpus_name!r} ({len(shared)} sentences)" if regime == "corpus" else ""
        return FittingSets(regime, {t: list(shared) for t in tasks}, True, text)
    raise InputError(f"unknown regime {regime!r}; use one of {', '.join(REGIMES)}")


def seen_counts(fit: Sequence[str] | None, eval_sentences: Sequence[str]) -> dict[str, int] | None:
    """How many of ``eval_sentences`` are in ``fit``: ``{"seen": k, "of": n}``; ``None`` where nothing is fitted."""
    if fit is None:
        return None
    fit_set = set(fit)
    return {"seen": sum(1 for s in eval_sentences if s in fit_set), "of": len(eval_sentences)}
