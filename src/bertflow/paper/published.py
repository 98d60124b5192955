"""Published numbers of BERT-flow, BERT-whitening and their re-evaluations, with the protocol each one used.

Every value is Spearman x 100 of cosine similarity, transcribed from ``shared/reference/anchors.md`` (sections 1.8,
1.9, 2.2 and 3.1) into ``published.json`` beside this module (package data), which cites its sources: Li et al.
2020 (BERT-flow, arXiv:2011.05864 v1), Su et al. 2021 (whitening, arXiv:2103.15316), Gao et al. 2021 (SimCSE) and
SimCSE issue #285.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

#: The package data file holding every number below.
DATA_FILE = "published.json"


@cache
def _data() -> dict[str, Any]:
    """The parsed ``published.json`` (read once per process)."""
    return json.loads(resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8"))


def _source(ref: dict[str, str]) -> str:
    """``"<paper>, <where>"`` of a ``{"paper": key of "sources", "where": table}`` reference."""
    return f"{_data()['sources'][ref['paper']]}, {ref['where']}"


PAPER_TASKS: tuple[str, ...] = tuple(_data()["paper_tasks"])
"""The seven tasks the papers average ("Avg."), in their column order: fixed by the papers, whatever tasks
:data:`bertflow.evaluation.datasets.TASK_SPECS` holds."""

#: Model ids the papers evaluated; ``reproduce`` shows published rows only for these.
PAPER_MODELS: tuple[str, ...] = tuple(_data()["paper_models"])


@dataclass(frozen=True)
class PublishedResult:
    """One published row: ``model`` (``"bert-base-uncased"`` or ``"bert-large-uncased"``), its ``label`` in its
    ``source`` (paper and table), our ``pooling`` name for it (the papers' "last2avg" is our ``first-last-avg``), our
    ``calibrators`` specs (both flow presets for a flow row: the papers do not say which Glow size produced the
    numbers, Table 7 and the code disagree), the ``regime`` (``"target"``, ``"nli"``, ``"none"``; ``None`` where the
    source does not say), the ``protocol`` (``"wmean"`` or ``"all"``: STS12-16 aggregation), the Spearman x 100
    ``scores`` by task name (:data:`PAPER_TASKS`, possibly only some) and caveats in ``note``."""

    model: str
    label: str
    pooling: str
    calibrators: tuple[str, ...]
    regime: str | None
    protocol: str
    scores: dict[str, float]
    source: str
    note: str = ""

    @property
    def average(self) -> float | None:
        """Plain mean of the papers' seven tasks (their "Avg."), or ``None`` if the row has fewer tasks."""
        if any(t not in self.scores for t in PAPER_TASKS):
            return None
        return sum(self.scores[t] for t in PAPER_TASKS) / len(PAPER_TASKS)


def _row(raw: dict[str, Any]) -> PublishedResult:
    note = str(raw.get("note", ""))
    if note.startswith("@"):  # a shared note, by its key in "notes"
        note = _data()["notes"][note[1:]]
    scores = {str(t): float(v) for t, v in raw["scores"].items()}
    fields = (raw["model"], raw["label"], raw["pooling"], tuple(raw["calibrators"]), raw["regime"], raw["protocol"])
    return PublishedResult(*fields, scores, _source(raw["source"]), note)


PUBLISHED: tuple[PublishedResult, ...] = tuple(_row(r) for r in _data()["rows"])
"""Every transcribed row (see the module docstring for sources)."""

#: The averages the sources print (or anchors.md computed), used to check the transcription.
QUOTED_AVERAGES: dict[tuple[str, str, str], float] = {
    (q["model"], q["label"], q["protocol"]): float(q["average"]) for q in _data()["quoted_averages"]
}

#: The paper's Table 6 (BERT-base, STS-B): Spearman x 100 of each similarity against edit distance and gold.
#: The paper does not say whether its edit distance counts characters or words.
TABLE6: dict[str, dict[str, float]] = {k: dict(v) for k, v in _data()["table6"]["values"].items()}
TABLE6_SOURCE = _source(_data()["table6"]["source"])

#: How the papers' models were built, for the caption of published rows shown beside another encoder.
PAPER_MODEL_TEXT: dict[str, str] = dict(_data()["paper_model_text"])

#: What is known of the pre-training of encoders that stand in for the papers' models (by folder name, lower case).
_STAND_IN_TEXT: dict[str, str] = dict(_data()["stand_in_text"])


def stand_in_caption(paper_model: str, model_id: str, layers: int, dim: int) -> str:
    """A caption for ``paper_model``'s published rows printed beside a different encoder ``model_id``: the rows are
    the paper's, not this encoder's, and how the two encoders differ (shape, and training text where bertflow knows
    it). ValueError for a ``paper_model`` not in :data:`PAPER_MODELS`."""
    if paper_model not in PAPER_MODELS:
        raise ValueError(f"no published rows for {paper_model!r}; use one of {', '.join(PAPER_MODELS)}")
    name = Path(model_id.rstrip("/")).name
    ours = f"`{name}` has {layers} layers and hidden size {dim}"
    known = _STAND_IN_TEXT.get(name.lower())
    ours += f", {known}" if known else ""
    return (
        f"The published rows below are {paper_model}'s ({PAPER_MODEL_TEXT[paper_model]}), not this encoder's: "
        f"{ours}. They show the size of the paper's effects, not numbers this encoder should match."
    )


def paper_model_name(model_id: str) -> str | None:
    """``"bert-base-uncased"`` / ``"bert-large-uncased"`` if ``model_id`` names one of them (a hub id with an
    organisation, ``google-bert/bert-base-uncased``, or a folder named after it), else ``None`` (cased or
    NLI-fine-tuned variants too)."""
    name = Path(model_id.rstrip("/")).name.lower()
    return name if name in PAPER_MODELS else None


def published_for(model_id: str) -> list[PublishedResult]:
    """Every published row for the model ``model_id`` names (empty for models the papers did not evaluate)."""
    name = paper_model_name(model_id)
    return [r for r in PUBLISHED if r.model == name] if name else []


def matching(model_id: str, pooling: str, calibrator: str, regime: str) -> list[PublishedResult]:
    """Published rows that correspond to one of our grid cells (same model, pooling, calibrator and regime).

    A published row whose regime is unknown (``None``) matches any regime. The raw encoder (calibrator
    ``"none"``) matches rows with regime ``"none"``.
    """
    cal = calibrator.strip().lower()
    rows = published_for(model_id)
    return [r for r in rows if r.pooling == pooling and cal in r.calibrators and r.regime in (None, regime)]
