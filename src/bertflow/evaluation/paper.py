"""Published numbers of BERT-flow, BERT-whitening and their re-evaluations, with the protocol each one used.

``bertflow reproduce`` prints these beside its own rows when the model is ``bert-base-uncased`` or
``bert-large-uncased``. Every value is Spearman x 100 of cosine similarity, transcribed from
``shared/reference/anchors.md`` (sections 1.8, 1.9, 2.2 and 3.1), which cites the tables below. The two
protocols are not comparable (see :mod:`bertflow.evaluation.sts`): "wmean" is what the BERT-flow and
whitening papers report for STS12-16, "all" is what SimCSE and later work report.

Sources:
    * Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020, arXiv:2011.05864 v1
      (Tables 2, 5 and 6 in the ar5iv rendering).
    * Su et al., "Whitening Sentence Representations for Better Semantics and Faster Retrieval", arXiv:2103.15316
      (Tables 1 and 2).
    * Gao et al., "SimCSE", EMNLP 2021 (Table 5, Table C.1: BERT-flow and whitening re-run under "all"); SimCSE
      issue #285 (first-last average with the true layers 1 + 12, "all").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .datasets import STS_TASKS

__all__ = [
    "PAPER_MODELS",
    "PublishedResult",
    "PUBLISHED",
    "QUOTED_AVERAGES",
    "TABLE6",
    "TABLE6_SOURCE",
    "PAPER_MODEL_TEXT",
    "paper_model_name",
    "published_for",
    "stand_in_caption",
    "matching",
]

#: Model ids the papers evaluated; ``reproduce`` shows published rows only for these.
PAPER_MODELS = ("bert-base-uncased", "bert-large-uncased")

_LI = "Li et al. 2020 (BERT-flow), arXiv:2011.05864v1"
_SU = "Su et al. 2021 (BERT-whitening), arXiv:2103.15316"
_SIMCSE = "Gao et al. 2021 (SimCSE)"


@dataclass(frozen=True)
class PublishedResult:
    """One published row.

    Attributes:
        model: ``"bert-base-uncased"`` or ``"bert-large-uncased"``.
        label: the row's name in its source.
        pooling: our pooling name for it (the papers' "last2avg" is our ``first-last-avg``).
        calibrators: our calibrator specs it corresponds to (both flow presets for a flow row: the papers do
            not say which Glow size produced the numbers, the paper's Table 7 and the code disagree).
        regime: ``"target"``, ``"nli"`` or ``"none"`` (no fitting); ``None`` where the source does not say.
        protocol: ``"wmean"`` or ``"all"`` (STS12-16 aggregation; STS-B and SICK-R are the same either way).
        scores: Spearman x 100 by task name (:data:`bertflow.evaluation.datasets.STS_TASKS`), possibly only some tasks.
        source: paper and table.
        note: caveats (e.g. the NLI regime's corpus differs from ours).
    """

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
        """Plain mean of the seven tasks (the papers' "Avg."), or ``None`` if the row has fewer tasks."""
        if any(t not in self.scores for t in STS_TASKS):
            return None
        return sum(self.scores[t] for t in STS_TASKS) / len(STS_TASKS)


def _row(values: Sequence[float]) -> dict[str, float]:
    return dict(zip(STS_TASKS, values, strict=True))


_NLI_NOTE = (
    "paper's NLI regime fits on all SNLI + MultiNLI sentences (~1M pairs); bertflow's nli regime uses the "
    "SNLI dev+test sentences (25.7k) shipped in the data folder"
)

PUBLISHED: tuple[PublishedResult, ...] = (
    # ---- BERT-base, "wmean" (the papers' own protocol) ---------------------------------------------------
    PublishedResult(
        "bert-base-uncased",
        "BERT-base (last-layer avg)",
        "mean",
        ("none",),
        "none",
        "wmean",
        _row([49.07, 55.92, 54.75, 62.75, 65.19, 47.29, 58.21]),
        f"{_LI}, Table 2",
    ),
    PublishedResult(
        "bert-base-uncased",
        'BERT-base-"last2avg" (really layers 1 + 12)',
        "first-last-avg",
        ("none",),
        "none",
        "wmean",
        _row([57.84, 61.95, 62.48, 70.95, 69.81, 59.04, 63.75]),
        f"{_LI}, Table 2",
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-base-flow (NLI*)",
        "first-last-avg",
        ("flow", "flow-paper"),
        "nli",
        "wmean",
        _row([59.54, 64.69, 64.66, 72.92, 71.84, 58.56, 65.44]),
        f"{_LI}, Table 2",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-base-flow (target)",
        "first-last-avg",
        ("flow", "flow-paper"),
        "target",
        "wmean",
        _row([63.48, 72.14, 68.42, 73.77, 75.37, 70.72, 63.11]),
        f"{_LI}, Table 2",
    ),
    PublishedResult(
        "bert-base-uncased",
        "first-last-avg (whitening paper's run)",
        "first-last-avg",
        ("none",),
        "none",
        "wmean",
        _row([57.86, 61.97, 62.49, 70.96, 69.76, 59.04, 63.75]),
        f"{_SU}, Table 1",
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-whitening (NLI)",
        "first-last-avg",
        ("whitening",),
        "nli",
        "wmean",
        _row([61.69, 65.70, 66.02, 75.11, 73.11, 68.19, 63.6]),
        f"{_SU}, Table 1",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-whitening-256 (NLI)",
        "first-last-avg",
        ("whitening-256",),
        "nli",
        "wmean",
        _row([61.46, 66.71, 66.17, 74.82, 72.10, 67.51, 64.9]),
        f"{_SU}, Table 1",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-whitening (target)",
        "first-last-avg",
        ("whitening",),
        "target",
        "wmean",
        _row([63.62, 73.02, 69.23, 74.52, 72.15, 71.34, 60.6]),
        f"{_SU}, Table 1",
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-whitening-256 (target)",
        "first-last-avg",
        ("whitening-256",),
        "target",
        "wmean",
        _row([63.89, 73.76, 69.08, 74.59, 74.40, 71.43, 62.2]),
        f"{_SU}, Table 1",
    ),
    # ---- BERT-base, STS-B only: the paper's Table 5 (last-layer average) ----------------------------------
    *(
        PublishedResult(
            "bert-base-uncased",
            f"BERT-base last-layer avg + {label}",
            "mean",
            (spec,),
            regime,
            "wmean",
            {"STS-B": value},
            f"{_LI}, Table 5",
            "fitting corpus of SN / NATSV not stated in the paper" if regime is None else "",
        )
        for label, spec, regime, value in (
            ("SN", "standard-norm", None, 55.46),
            ("NATSV k=1", "natsv-1", None, 51.79),
            ("NATSV k=10", "natsv-10", None, 60.40),
            ("SN + NATSV k=1", "standard-norm+natsv-1", None, 56.02),
            ("SN + NATSV k=6 (k tuned on dev)", "standard-norm+natsv-6", None, 63.51),
            ("flow (target)", "flow", "target", 65.62),
            ("flow (target)", "flow-paper", "target", 65.62),
        )
    ),
    # ---- BERT-base, "all" (re-evaluations by SimCSE) -----------------------------------------------------
    PublishedResult(
        "bert-base-uncased",
        "first-last avg (true layers 1 + 12)",
        "first-last-avg",
        ("none",),
        "none",
        "all",
        _row([45.09, 64.30, 54.56, 70.52, 67.87, 59.05, 63.75]),
        f"{_SIMCSE}, issue #285 (fixed evaluation.py)",
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-flow (NLI)",
        "first-last-avg",
        ("flow", "flow-paper"),
        "nli",
        "all",
        _row([58.40, 67.10, 60.85, 75.16, 71.22, 68.66, 64.47]),
        f"{_SIMCSE}, Table 5 / Table C.1",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-flow (target)",
        "first-last-avg",
        ("flow", "flow-paper"),
        "target",
        "all",
        _row([53.15, 78.38, 66.02, 62.09, 70.84, 71.70, 61.97]),
        f"{_SIMCSE}, Table C.1",
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-whitening (NLI)",
        "first-last-avg",
        ("whitening",),
        "nli",
        "all",
        _row([57.83, 66.90, 60.90, 75.08, 71.31, 68.24, 63.73]),
        f"{_SIMCSE}, Table 5 / Table C.1",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-base-uncased",
        "BERT-whitening (target)",
        "first-last-avg",
        ("whitening",),
        "target",
        "all",
        _row([42.88, 77.77, 66.28, 63.60, 67.58, 71.34, 60.40]),
        f"{_SIMCSE}, Table C.1",
    ),
    # ---- BERT-large, "wmean" -------------------------------------------------------------------------------
    PublishedResult(
        "bert-large-uncased",
        "BERT-large (last-layer avg)",
        "mean",
        ("none",),
        "none",
        "wmean",
        _row([46.89, 53.32, 49.27, 56.54, 61.63, 46.99, 53.74]),
        f"{_LI}, Table 2",
    ),
    PublishedResult(
        "bert-large-uncased",
        'BERT-large-"last2avg" (really layers 1 + 24)',
        "first-last-avg",
        ("none",),
        "none",
        "wmean",
        _row([57.68, 61.37, 61.02, 68.04, 70.32, 59.56, 60.22]),
        f"{_LI}, Table 2",
    ),
    PublishedResult(
        "bert-large-uncased",
        "BERT-large-flow (NLI*)",
        "first-last-avg",
        ("flow", "flow-paper"),
        "nli",
        "wmean",
        _row([61.72, 66.05, 66.34, 74.87, 74.47, 68.09, 64.62]),
        f"{_LI}, Table 2",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-large-uncased",
        "BERT-large-flow (target)",
        "first-last-avg",
        ("flow", "flow-paper"),
        "target",
        "wmean",
        _row([65.20, 73.39, 69.42, 74.92, 77.63, 72.26, 62.50]),
        f"{_LI}, Table 2",
    ),
    PublishedResult(
        "bert-large-uncased",
        "first-last-avg (whitening paper's run)",
        "first-last-avg",
        ("none",),
        "none",
        "wmean",
        _row([57.73, 61.17, 61.18, 68.07, 70.25, 59.59, 60.34]),
        f"{_SU}, Table 2",
    ),
    PublishedResult(
        "bert-large-uncased",
        "BERT-whitening (NLI)",
        "first-last-avg",
        ("whitening",),
        "nli",
        "wmean",
        _row([62.54, 67.31, 67.12, 75.00, 76.29, 68.54, 62.4]),
        f"{_SU}, Table 2",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-large-uncased",
        "BERT-whitening-384 (NLI)",
        "first-last-avg",
        ("whitening-384",),
        "nli",
        "wmean",
        _row([62.28, 67.88, 67.01, 75.49, 75.46, 68.60, 63.8]),
        f"{_SU}, Table 2",
        _NLI_NOTE,
    ),
    PublishedResult(
        "bert-large-uncased",
        "BERT-whitening (target)",
        "first-last-avg",
        ("whitening",),
        "target",
        "wmean",
        _row([64.02, 72.67, 68.93, 73.57, 72.52, 72.14, 59.3]),
        f"{_SU}, Table 2",
    ),
    PublishedResult(
        "bert-large-uncased",
        "BERT-whitening-384 (target)",
        "first-last-avg",
        ("whitening-384",),
        "target",
        "wmean",
        _row([64.34, 74.60, 69.64, 74.68, 75.90, 72.48, 60.8]),
        f"{_SU}, Table 2",
    ),
)
"""Every transcribed row (see the module docstring for sources)."""

#: The averages the sources print (or anchors.md computed), used to check the transcription.
QUOTED_AVERAGES: dict[tuple[str, str, str], float] = {
    ("bert-base-uncased", "BERT-base (last-layer avg)", "wmean"): 56.17,
    ("bert-base-uncased", 'BERT-base-"last2avg" (really layers 1 + 12)', "wmean"): 63.69,
    ("bert-base-uncased", "BERT-base-flow (NLI*)", "wmean"): 65.38,
    ("bert-base-uncased", "BERT-base-flow (target)", "wmean"): 69.57,
    ("bert-base-uncased", "first-last-avg (whitening paper's run)", "wmean"): 63.69,
    ("bert-base-uncased", "BERT-whitening (NLI)", "wmean"): 67.63,
    ("bert-base-uncased", "BERT-whitening-256 (NLI)", "wmean"): 67.67,
    ("bert-base-uncased", "BERT-whitening (target)", "wmean"): 69.21,
    ("bert-base-uncased", "BERT-whitening-256 (target)", "wmean"): 69.91,
    ("bert-base-uncased", "first-last avg (true layers 1 + 12)", "all"): 60.73,
    ("bert-base-uncased", "BERT-flow (NLI)", "all"): 66.55,
    ("bert-base-uncased", "BERT-flow (target)", "all"): 66.31,
    ("bert-base-uncased", "BERT-whitening (NLI)", "all"): 66.28,
    ("bert-base-uncased", "BERT-whitening (target)", "all"): 64.26,
    ("bert-large-uncased", "BERT-large (last-layer avg)", "wmean"): 52.63,
    ("bert-large-uncased", 'BERT-large-"last2avg" (really layers 1 + 24)', "wmean"): 62.60,
    ("bert-large-uncased", "BERT-large-flow (NLI*)", "wmean"): 68.02,
    ("bert-large-uncased", "BERT-large-flow (target)", "wmean"): 70.76,
    ("bert-large-uncased", "first-last-avg (whitening paper's run)", "wmean"): 62.62,
    ("bert-large-uncased", "BERT-whitening (NLI)", "wmean"): 68.46,
    ("bert-large-uncased", "BERT-whitening-384 (NLI)", "wmean"): 68.65,
    ("bert-large-uncased", "BERT-whitening (target)", "wmean"): 69.02,
    ("bert-large-uncased", "BERT-whitening-384 (target)", "wmean"): 70.35,
}

#: The paper's Table 6 (BERT-base, STS-B): Spearman x 100 of each similarity against edit distance and gold.
#: The paper does not say whether its edit distance counts characters or words.
TABLE6: dict[str, dict[str, float]] = {
    "gold": {"vs_edit_distance": -24.61, "vs_gold": 100.00},
    "raw": {"vs_edit_distance": -50.49, "vs_gold": 59.30},
    "calibrated": {"vs_edit_distance": -28.01, "vs_gold": 74.09},
}
TABLE6_SOURCE = f"{_LI}, Table 6 (BERT-base; 'BERT-induced' = raw, 'Flow-induced' = calibrated)"


#: How the papers' models were built, for the caption of published rows shown beside another encoder.
PAPER_MODEL_TEXT = {
    "bert-base-uncased": "12 layers, hidden 768, 110M parameters, pre-trained with masked-language modelling and "
    "next-sentence prediction on BooksCorpus + English Wikipedia (3.3B words)",
    "bert-large-uncased": "24 layers, hidden 1024, 340M parameters, pre-trained with masked-language modelling and "
    "next-sentence prediction on BooksCorpus + English Wikipedia (3.3B words)",
}

#: What is known of the pre-training of encoders that stand in for the papers' models (by folder name, lower case).
_STAND_IN_TEXT = {
    "bert-gutenberg-l6-h384": "pre-trained with masked-language modelling only on 108 public-domain Project "
    "Gutenberg books, mostly 19th-century (11.7M words, 15.4M tokens; about 1/280 of BERT's text), 22.7M parameters",
}


def stand_in_caption(paper_model: str, model_id: str, layers: int, dim: int) -> str:
    """A caption for ``paper_model``'s published rows printed beside a different encoder ``model_id``.

    Says that the rows are the paper's, not this encoder's, and how the two encoders differ (shape, and training
    text where bertflow knows it).

    Raises:
        ValueError: ``paper_model`` is not one of :data:`PAPER_MODELS`.
    """
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
    """``"bert-base-uncased"`` / ``"bert-large-uncased"`` if ``model_id`` names one of them, else ``None``.

    Accepts hub ids with an organisation (``google-bert/bert-base-uncased``) and local folders named after the
    model; anything else (including cased or NLI-fine-tuned variants) returns ``None``.
    """
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
    return [
        r
        for r in published_for(model_id)
        if r.pooling == pooling and cal in r.calibrators and (r.regime is None or r.regime == regime)
    ]
