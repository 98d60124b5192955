"""STS evaluation of an encoder + calibrator, and the grid behind ``bertflow reproduce``.

A *cell* is one (pooling, calibrator, fitting regime) on one encoder. Its calibrator is fitted without labels on
the regime's sentences and the seven STS tasks are scored by cosine similarity in the calibrated space, under both
the "all" and the "wmean" convention (see :mod:`bertflow.evaluation.sts`). Fitting regimes:

* ``target``: per task, every sentence of that task (STS-B and SICK-R: train + dev + test; STS12-16: all subsets).
  The BERT-flow paper's default. Transductive: the calibrator sees the test sentences (never their scores).
* ``train``: per task, the train split only (STS-B and SICK-R); STS12-16 have none and are reported n/a.
* ``nli``: one fit on the SNLI dev + test sentences of the data folder, used for every task.
* ``corpus``: one fit on a user's text file, used for every task.
* ``none``: no fitting (the raw encoder, calibrator ``none``).

Every sentence is encoded once for all poolings (:func:`bertflow.evaluation.cache.embed_cached`), so a grid costs
one encoder pass plus the calibrator fits. Each cell records how many evaluation sentences its fitting set
contained ("test sentences seen").
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..calibrators import Calibrator, parse_calibrator
from ..encoding.encoder import SentenceEncoder
from ..errors import BertflowError, InputError
from .cache import EmbeddingCache, embed_cached, pooling_key
from .datasets import STS_TASKS, StsTask, load_nli_sentences, load_sts_tasks, resolve_data_dir
from .paper import PAPER_MODELS, PublishedResult, matching, paper_model_name, published_for, stand_in_caption
from .sts import StsReport, TaskScore, evaluate_task

__all__ = [
    "REGIMES",
    "DEFAULT_POOLINGS",
    "DEFAULT_REGIMES",
    "default_calibrators",
    "FittingSets",
    "fitting_sets",
    "EmbeddingTable",
    "CellResult",
    "GridConfig",
    "GridResult",
    "run_grid",
    "load_encoder",
    "evaluate_embedder",
    "score_fitted",
    "machine_info",
]

logger = logging.getLogger(__name__)

#: Fitting regimes a grid accepts (``none`` is implied by the calibrator ``none``).
REGIMES = ("target", "train", "nli", "corpus")
#: Poolings of the default grid: all three come from one forward pass.
DEFAULT_POOLINGS = ("mean", "cls", "first-last-avg")
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

Progress = Callable[[str], None]

_PROTOCOL = {
    "metric": "Spearman × 100 of cosine similarity against the gold score (Pearson in the JSON)",
    "all": "one correlation over all subsets of a task concatenated (SBERT, SimCSE, MTEB)",
    "wmean": "subset-size-weighted mean of per-subset correlations (BERT-flow and whitening papers)",
    "average": "plain mean over the tasks (the papers' Avg.)",
    "seeds": "flow rows: mean ± sample std (ddof=1) over seeds 0..N-1",
}


def default_calibrators(dim: int) -> list[str]:
    """The calibrators of the default grid for D-dimensional embeddings.

    ``natsv-10`` and ``standard-norm+natsv-6`` are the paper's best Table 5 settings; ``whitening-K`` keeps about
    a third of the dimensions as the whitening paper recommends (K = 256 for D = 768, 384 for D = 1024, else D/3).
    """
    k = {768: 256, 1024: 384}.get(dim, max(1, round(dim / 3)))
    natsv = min(10, max(1, dim - 1))
    return [
        "none",
        "standard-norm",
        f"natsv-{natsv}",
        f"standard-norm+natsv-{min(6, natsv)}",
        "whitening",
        f"whitening-{k}",
        "flow",
        "flow-paper",
    ]


def load_encoder(
    model: str | None,
    *,
    pooling: str | Sequence[int] = "mean",
    max_length: int = 64,
    device: str | None = None,
    dtype: str = "auto",
) -> SentenceEncoder:
    """Build the :class:`SentenceEncoder` of a grid (architectures without an SDPA kernel, such as MPNet under
    transformers 5, fall back to the default attention inside ``SentenceEncoder``)."""
    return SentenceEncoder(model, pooling=pooling, max_length=max_length, device=device, dtype=dtype)


def _blas_threads(n: int | None) -> contextlib.AbstractContextManager[Any]:
    """Limit BLAS/OpenMP threads to ``n`` for the ``with`` block (no limit for ``None``)."""
    if n is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(n)


def _is_seeded(spec: str) -> bool:
    """Whether a calibrator spec contains a flow (whose fit depends on a seed)."""
    return any(p.strip().lower().startswith("flow") for p in spec.split("+"))


def _is_identity(spec: str) -> bool:
    return spec.strip().lower() in ("none", "raw", "identity")


# -------------------------------------------------------------------------------------------------------
# Fitting sets
# -------------------------------------------------------------------------------------------------------


@dataclass
class FittingSets:
    """The unlabeled sentences a regime fits on.

    Attributes:
        regime: ``"none"``, ``"target"``, ``"train"``, ``"nli"`` or ``"corpus"``.
        per_task: for each task, its fitting sentences; ``None`` where the regime does not apply (train split
            of STS12-16); for shared regimes (nli, corpus) every task maps to the same list.
        shared: whether one fit serves every task.
        description: what the sentences are, for reports.
    """

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
    """Which sentences each task's calibrator is fitted on under ``regime``.

    Args:
        regime: one of ``"none"``, :data:`REGIMES`.
        tasks: the loaded tasks.
        nli: the NLI sentences (needed for ``"nli"``).
        corpus: the user corpus (needed for ``"corpus"``).
        corpus_name: how the corpus is named in reports.

    Raises:
        InputError: unknown regime or missing sentences.
    """
    if regime == "none":
        return FittingSets("none", {t: [] for t in tasks}, True, REGIME_TEXT["none"])
    if regime == "target":
        return FittingSets(
            regime, {t: task.fit_sentences("target") for t, task in tasks.items()}, False, REGIME_TEXT[regime]
        )
    if regime == "train":
        per = {t: task.fit_sentences("train") if task.has_train_split else None for t, task in tasks.items()}
        return FittingSets(regime, per, False, REGIME_TEXT[regime])
    if regime in ("nli", "corpus"):
        shared = nli if regime == "nli" else corpus
        if not shared:
            raise InputError(
                "the corpus regime needs a corpus file (--corpus FILE)" if regime == "corpus" else "no NLI sentences"
            )
        text = REGIME_TEXT[regime] + (f" {corpus_name!r} ({len(shared)} sentences)" if regime == "corpus" else "")
        return FittingSets(regime, {t: list(shared) for t in tasks}, True, text)
    raise InputError(f"unknown regime {regime!r}; use one of {', '.join(REGIMES)}")


def _seen(fit: Sequence[str] | None, eval_sentences: Sequence[str]) -> dict[str, int] | None:
    if fit is None:
        return None
    fit_set = set(fit)
    return {"seen": sum(1 for s in eval_sentences if s in fit_set), "of": len(eval_sentences)}


# -------------------------------------------------------------------------------------------------------
# Embedding table
# -------------------------------------------------------------------------------------------------------


class EmbeddingTable:
    """Raw embeddings of a fixed set of distinct sentences under several poolings.

    Args:
        sentences: the distinct sentences, N of them.
        embeddings: ``{pooling_key: float32 [N, D]}``, rows in the order of ``sentences``.
    """

    def __init__(self, sentences: Sequence[str], embeddings: Mapping[str, np.ndarray]) -> None:
        self.index = {s: i for i, s in enumerate(sentences)}
        self.embeddings = dict(embeddings)

    def get(self, pooling: str, sentences: Sequence[str]) -> np.ndarray:
        """Rows for ``sentences`` (each must be in the table) under ``pooling``: float32 [len(sentences), D]."""
        try:
            rows = np.fromiter((self.index[s] for s in sentences), dtype=np.int64, count=len(sentences))
        except KeyError as e:
            raise InputError(f"sentence {e.args[0]!r:.60} was never encoded") from None
        return self.embeddings[pooling][rows]


# -------------------------------------------------------------------------------------------------------
# One cell
# -------------------------------------------------------------------------------------------------------


def _stat(values: Sequence[float]) -> dict[str, Any]:
    """mean, sample std (ddof=1; None for one value) and n of finite values; JSON-ready."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    if not len(arr):
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if len(arr) > 1 else None,
        "n": int(len(arr)),
    }


@dataclass
class CellResult:
    """Scores of one (pooling, calibrator, regime) cell, over one or several seeds.

    Attributes:
        pooling, calibrator, regime: the cell.
        seeds: the flow seeds used (``[None]`` for deterministic calibrators).
        tasks: the tasks of the grid, in order.
        reports: one :class:`StsReport` per seed, holding the tasks that were evaluated (n/a tasks missing).
        test_seen: per task, ``{"seen": k, "of": n}`` evaluation sentences contained in the fitting set, or
            ``None`` where the task was not evaluated.
        seconds: wall time of fitting and scoring the cell, all seeds.
        error: the message of a failed fit (the cell then has no scores).
    """

    pooling: str
    calibrator: str
    regime: str
    seeds: list[int | None]
    tasks: list[str]
    reports: list[StsReport] = field(default_factory=list)
    test_seen: dict[str, dict[str, int] | None] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    seen_note: str | None = None

    def evaluated(self) -> list[str]:
        """Tasks with scores (all of them unless the regime does not apply to some)."""
        return [t for t in self.tasks if self.reports and t in self.reports[0].tasks]

    def task_stat(self, task: str, protocol: str, metric: str = "spearman") -> dict[str, Any] | None:
        """mean/std over seeds of one task's score, or ``None`` for a task that was not evaluated."""
        if not self.reports or task not in self.reports[0].tasks:
            return None
        return _stat([r.tasks[task].score(protocol, metric) for r in self.reports])  # type: ignore[arg-type]

    def average_stat(self, protocol: str, metric: str = "spearman") -> dict[str, Any] | None:
        """mean/std over seeds of the average over the grid's tasks; ``None`` unless every task was evaluated."""
        if not self.reports or len(self.evaluated()) != len(self.tasks):
            return None
        return _stat([r.average(protocol, metric) for r in self.reports])  # type: ignore[arg-type]

    def seen_summary(self) -> str:
        """A short statement of how many evaluation sentences the calibrator saw while fitting."""
        if self.seen_note is not None:
            return self.seen_note
        if self.regime == "none":
            return "n/a (no fitting)"
        counts = [v for v in self.test_seen.values() if v is not None]
        seen, total = sum(c["seen"] for c in counts), sum(c["of"] for c in counts)
        if total == 0:
            return "n/a"
        if seen == total:
            return "all (transductive)" if self.regime == "target" else f"all {total}"
        if seen == 0:
            return "none"
        return f"{seen} of {total} ({100 * seen / total:.1f}%)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per task mean/std under both conventions, per-subset means, averages and every run."""
        tasks: dict[str, Any] = {}
        for t in self.tasks:
            if self.task_stat(t, "all") is None:
                tasks[t] = None
                continue
            first = self.reports[0].tasks[t]
            tasks[t] = {
                "all": self.task_stat(t, "all"),
                "wmean": self.task_stat(t, "wmean"),
                "pearson": {"all": self.task_stat(t, "all", "pearson"), "wmean": self.task_stat(t, "wmean", "pearson")},
                "subsets": [
                    {
                        "name": s.name,
                        "n_pairs": s.n_pairs,
                        "spearman": _stat([r.tasks[t].subsets[i].spearman for r in self.reports]),
                    }
                    for i, s in enumerate(first.subsets)
                ],
            }
        return {
            "pooling": self.pooling,
            "calibrator": self.calibrator,
            "regime": self.regime,
            "seeds": self.seeds,
            "test_sentences_seen": self.test_seen,
            "test_sentences_seen_summary": self.seen_summary(),
            "tasks": tasks,
            "average": {p: self.average_stat(p) for p in ("all", "wmean")},
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "runs": [r.to_dict() for r in self.reports],
        }


def score_fitted(
    table: EmbeddingTable, pooling: str, calibrator: Calibrator | None, tasks: Mapping[str, StsTask]
) -> StsReport:
    """Score tasks with an already-fitted calibrator (``None``: raw embeddings) on cached embeddings.

    Returns:
        The report over ``tasks`` (both conventions, per subset).
    """

    def embed(sentences: list[str]) -> np.ndarray:
        raw = table.get(pooling, sentences)
        return raw if calibrator is None else calibrator.transform(raw)

    return StsReport({name: evaluate_task(task, embed) for name, task in tasks.items()})


def _run_cell(
    table: EmbeddingTable,
    pooling: str,
    spec: str,
    fits: FittingSets,
    tasks: Mapping[str, StsTask],
    seeds: Sequence[int | None],
    flow_kwargs: Mapping[str, Any],
) -> CellResult:
    """Fit ``spec`` under ``fits`` for each seed and score every task it applies to."""
    started = time.perf_counter()
    cell = CellResult(pooling, spec, fits.regime, list(seeds), list(tasks))
    applicable = {t: task for t, task in tasks.items() if fits.per_task[t] is not None}
    cell.test_seen = {t: _seen(fits.per_task[t], task.eval_sentences()) for t, task in tasks.items()}
    if fits.regime == "none":
        cell.test_seen = {t: None for t in tasks}
    try:
        for seed in seeds:
            kwargs = dict(flow_kwargs)
            if seed is not None:
                kwargs["seed"] = seed
            scores: dict[str, TaskScore] = {}
            if fits.regime == "none":
                scores = score_fitted(table, pooling, None, applicable).tasks
            elif fits.shared:
                # One fit serves every task: fit once, score each task with it.
                sentences = next(iter(fits.per_task.values())) or []
                cal = parse_calibrator(spec, **kwargs).fit(table.get(pooling, sentences))
                scores = score_fitted(table, pooling, cal, applicable).tasks
            else:
                for t, task in applicable.items():
                    cal = parse_calibrator(spec, **kwargs).fit(table.get(pooling, fits.per_task[t] or []))
                    scores[t] = score_fitted(table, pooling, cal, {t: task}).tasks[t]
            cell.reports.append(StsReport(scores))
    except BertflowError as e:
        cell.reports = []
        cell.error = f"{type(e).__name__}: {e}"
        logger.warning("%s / %s / %s failed: %s", pooling, spec, fits.regime, cell.error)
    cell.seconds = time.perf_counter() - started
    return cell


# -------------------------------------------------------------------------------------------------------
# The grid
# -------------------------------------------------------------------------------------------------------


@dataclass
class GridConfig:
    """What ``bertflow reproduce`` (and ``bertflow evaluate``) runs.

    Attributes:
        model: hub id or folder; ``None`` is the embedded all-MiniLM-L6-v2.
        poolings: pooling names (or comma-separated layer indices).
        calibrators: calibrator specs (:func:`bertflow.calibrators.parse_calibrator`); ``None`` uses
            :func:`default_calibrators` for the model's dimension.
        regimes: subset of :data:`REGIMES`.
        tasks: STS task names.
        seeds: flow rows are fitted with seeds ``0 .. seeds-1`` and reported as mean +- std.
        corpus: sentences of the ``corpus`` regime; ``corpus_name`` names them in reports.
        max_length, batch_size, device, dtype: encoder settings.
        data_dir: STS data folder (see :func:`bertflow.evaluation.datasets.resolve_data_dir`).
        cache_dir: embedding cache folder; ``use_cache=False`` keeps nothing on disk.
        flow_epochs: flow training epochs.
        flow_options: further :class:`~bertflow.calibrators.FlowCalibrator` arguments for every flow cell (``lr``,
            ``coupling``, ``n_levels``, ``depth``, ``validation_fraction`` ...), for ablations; the seed is the grid's.
        paper_rows: a paper model (``"bert-base-uncased"``, ``"bert-large-uncased"``) whose published rows are shown
            beside this encoder's, with a caption saying how the two differ; ``None`` shows them only when the
            encoder is that model.
        fit_threads: BLAS threads while fitting and scoring calibrators (through ``threadpoolctl``; ``None`` keeps the
            library default). 1 by default: the matrices are small, and when other processes hold the cores a
            multi-threaded SVD waits on thread barriers (measured 11x slower on a busy 2-core machine).
        command: the command line that produced the run, for the report.
    """

    model: str | None = None
    poolings: Sequence[str] = DEFAULT_POOLINGS
    calibrators: Sequence[str] | None = None
    regimes: Sequence[str] = DEFAULT_REGIMES
    tasks: Sequence[str] = STS_TASKS
    seeds: int = 1
    corpus: Sequence[str] | None = None
    corpus_name: str | None = None
    max_length: int = 64
    batch_size: int | None = None
    device: str | None = None
    dtype: str = "auto"
    data_dir: str | Path | None = None
    cache_dir: str | Path | None = None
    use_cache: bool = True
    flow_epochs: float = 1.0
    flow_options: Mapping[str, Any] = field(default_factory=dict)
    fit_threads: int | None = 1
    paper_rows: str | None = None
    command: str | None = None


@dataclass
class GridResult:
    """The cells of a grid with everything needed to read them: model, protocol, machine, time.

    Attributes:
        meta: JSON-ready description of the run (model, data, regimes, machine, timings, command).
        cells: one :class:`CellResult` per (pooling, calibrator, regime), in grid order.
        published: the papers' rows for this model, or for the paper model ``GridConfig.paper_rows`` names (empty
            otherwise).
    """

    meta: dict[str, Any]
    cells: list[CellResult]
    published: list[PublishedResult] = field(default_factory=list)

    def raw_cell(self, pooling: str) -> CellResult | None:
        """The uncalibrated cell of ``pooling``, if the grid has one."""
        return next((c for c in self.cells if c.pooling == pooling and c.regime == "none"), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``meta``, ``cells`` and the published rows shown beside them."""
        return {
            "meta": self.meta,
            "cells": [c.to_dict() for c in self.cells],
            "published": [
                {
                    "label": r.label,
                    "model": r.model,
                    "pooling": r.pooling,
                    "calibrators": list(r.calibrators),
                    "regime": r.regime,
                    "protocol": r.protocol,
                    "scores": r.scores,
                    "average": r.average,
                    "source": r.source,
                    "note": r.note,
                }
                for r in self.published
            ],
        }

    def to_markdown(self, *, title: str = "bertflow reproduce", subsets: bool = False) -> str:
        """The report: settings, a summary table, per-task tables under both conventions, published rows.

        Args:
            title: the page's heading.
            subsets: also list per-subset Spearman for every cell (long; ``bertflow evaluate`` uses it).
        """
        return _render_markdown(self, title=title, subsets=subsets)


def machine_info(device: str | None = None) -> dict[str, Any]:
    """Platform, CPU count and model, library versions and compute device, for reports."""
    import scipy
    import torch
    import transformers

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "torch_threads": torch.get_num_threads(),
        "device": dev,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "bertflow": __version__,
    }
    if dev.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(dev))
    return info


def run_grid(
    config: GridConfig,
    *,
    encoder: SentenceEncoder | None = None,
    tasks: Mapping[str, StsTask] | None = None,
    nli: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> GridResult:
    """Run a pooling x calibrator x regime grid on one encoder.

    Args:
        config: the grid (see :class:`GridConfig`).
        encoder: an already-built encoder to use instead of ``config.model`` (its pooling is ignored).
        tasks: already-loaded tasks instead of reading ``config.tasks`` from ``config.data_dir``.
        nli: NLI sentences instead of reading them from the data folder.
        progress: called with one line per finished step (e.g. ``print`` to stderr).

    Returns:
        The cells and the run's metadata. Cells whose fit failed carry an ``error`` instead of scores.

    Raises:
        InputError: unknown pooling, calibrator or regime, ``seeds < 1``, ``corpus`` without sentences.
        DataNotFoundError: the STS (or NLI) data is missing.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    if config.seeds < 1:
        raise InputError(f"seeds must be at least 1, got {config.seeds}")
    regimes = list(dict.fromkeys(r.strip().lower() for r in config.regimes))
    for r in regimes:
        if r not in REGIMES:
            raise InputError(f"unknown regime {r!r}; use one of {', '.join(REGIMES)}")
    if "corpus" in regimes and not config.corpus:
        raise InputError("the corpus regime needs a corpus file (--corpus FILE)")
    if config.paper_rows is not None and config.paper_rows not in PAPER_MODELS:
        raise InputError(f"no published rows for {config.paper_rows!r}; use one of {', '.join(PAPER_MODELS)}")
    if encoder is None:
        encoder = load_encoder(config.model, max_length=config.max_length, device=config.device, dtype=config.dtype)
    poolings = list(dict.fromkeys(pooling_key(p, encoder.num_layers) for p in config.poolings))
    if not poolings:
        raise InputError("give at least one pooling")
    specs = list(dict.fromkeys(config.calibrators or default_calibrators(encoder.dim)))
    if "seed" in config.flow_options:
        raise InputError("flow_options must not set the seed: the grid's seeds are 0 .. seeds-1")
    flow_kwargs: dict[str, Any] = {**config.flow_options, "epochs": config.flow_epochs, "device": config.device}
    for spec in specs:
        # Unknown specs and flow options fail now, not after encoding.
        try:
            parse_calibrator(spec, **(flow_kwargs if _is_seeded(spec) else {}))
        except TypeError as e:
            raise InputError(f"bad flow option for {spec!r}: {e}") from None
    if all(_is_identity(s) for s in specs):
        regimes = []  # nothing is fitted, so no fitting sentences need encoding
    data_dir: Path | None = None
    if tasks is None:
        data_dir = resolve_data_dir(config.data_dir)
        tasks = load_sts_tasks(config.tasks, data_dir)
    # The papers' column order, whatever order the tasks were named in.
    tasks = dict(sorted(tasks.items(), key=lambda kv: STS_TASKS.index(kv[0]) if kv[0] in STS_TASKS else len(STS_TASKS)))
    nli_sentences: list[str] | None = None
    if "nli" in regimes:
        nli_sentences = list(nli) if nli is not None else load_nli_sentences(data_dir or config.data_dir)
    corpus = list(dict.fromkeys(config.corpus)) if config.corpus else None

    # Every sentence any cell needs, encoded once for all poolings.
    fit_by_regime = {
        r: fitting_sets(r, tasks, nli=nli_sentences, corpus=corpus, corpus_name=config.corpus_name) for r in regimes
    }
    needed: dict[str, None] = {}
    for task in tasks.values():
        needed.update(dict.fromkeys(task.eval_sentences()))
    for fits in fit_by_regime.values():
        for sentences in fits.per_task.values():
            needed.update(dict.fromkeys(sentences or []))
    sentences = list(needed)
    cache = EmbeddingCache(config.cache_dir) if config.use_cache else None
    say(f"encoding {len(sentences)} distinct sentences with {encoder.model_id} ({', '.join(poolings)})")
    t0 = time.perf_counter()
    embeddings = embed_cached(encoder, sentences, poolings, cache=cache, batch_size=config.batch_size)
    encode_seconds = time.perf_counter() - t0
    say(f"encoded in {encode_seconds:.1f} s")
    table = EmbeddingTable(sentences, embeddings)

    cells: list[CellResult] = []
    plan: list[tuple[str, str, FittingSets]] = []
    for pooling in poolings:
        for spec in specs:
            if _is_identity(spec):
                plan.append((pooling, spec, fitting_sets("none", tasks)))
                continue
            for r in regimes:
                plan.append((pooling, spec, fit_by_regime[r]))
    for i, (pooling, spec, fits) in enumerate(plan, start=1):
        seeds: list[int | None] = list(range(config.seeds)) if _is_seeded(spec) else [None]
        with _blas_threads(config.fit_threads):
            cell = _run_cell(table, pooling, spec, fits, tasks, seeds, flow_kwargs)
        cells.append(cell)
        avg = cell.average_stat("all")
        shown = "error" if cell.error else _fmt(avg)
        say(f"[{i}/{len(plan)}] {pooling} / {spec} / {fits.regime}: avg all {shown} ({cell.seconds:.1f} s)")

    meta = {
        "command": config.command,
        "model": _model_meta(encoder),
        "tasks": {t: {"n_pairs": task.n_eval_pairs, "subsets": list(task.eval_subsets)} for t, task in tasks.items()},
        "data_dir": str(data_dir) if data_dir else None,
        "poolings": poolings,
        "calibrators": specs,
        "regimes": {
            **({"none": REGIME_TEXT["none"]} if any(_is_identity(s) for s in specs) else {}),
            **{r: fit_by_regime[r].description for r in regimes},
        },
        "seeds": config.seeds,
        "flow": {"epochs": config.flow_epochs, **config.flow_options} if any(_is_seeded(s) for s in specs) else {},
        "fit_threads": config.fit_threads,
        "published": _published_meta(encoder, config.paper_rows),
        "protocol": _PROTOCOL,
        "machine": machine_info(config.device),
        **_run_record(started, encode_seconds, cells, len(sentences), cache),
    }
    return GridResult(meta, cells, published_for(meta["published"]["model"] or ""))


def _published_meta(encoder: SentenceEncoder, paper_rows: str | None) -> dict[str, Any]:
    """Whose published rows a report shows: the encoder's own if the papers evaluated it, else ``paper_rows``'s
    with a caption saying how that model differs from the encoder."""
    own = paper_model_name(encoder.model_id)
    if own is not None or paper_rows is None:
        return {"model": own, "caption": None}
    return {
        "model": paper_rows,
        "caption": stand_in_caption(paper_rows, encoder.model_id, encoder.num_layers, encoder.dim),
    }


def _run_record(
    started: float, encode_seconds: float, cells: Sequence[Any], n_sentences: int, cache: EmbeddingCache | None
) -> dict[str, Any]:
    """The part of a run's metadata that says how long it took, on how many sentences, from which cache."""
    elapsed = time.perf_counter() - started
    return {
        "seconds": {
            "total": round(elapsed, 1),
            "encode": round(encode_seconds, 1),
            "cells": round(sum(c.seconds for c in cells), 1),
        },
        "sentences": {"distinct": n_sentences},
        "cache": str(cache.root) if cache else None,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - elapsed)),
    }


def evaluate_embedder(
    embedder: Any,
    *,
    tasks: Mapping[str, StsTask] | None = None,
    task_names: Sequence[str] = STS_TASKS,
    data_dir: str | Path | None = None,
    cache: EmbeddingCache | None = None,
    batch_size: int | None = None,
    command: str | None = None,
) -> GridResult:
    """Score a fitted :class:`~bertflow.embedder.Embedder` (e.g. loaded from ``bertflow fit``) on STS tasks.

    The calibrator is used as saved; its fitting corpus is not known here, so the report says so instead of
    claiming whether test sentences were seen (the saved fitting record, regime label and sentence count, is
    quoted).

    Args:
        embedder: encoder + fitted calibrator.
        tasks: already-loaded tasks; else ``task_names`` are read from ``data_dir``.
        cache: embedding cache for the raw embeddings (``None``: nothing stored).
        batch_size: optional cap on sentences per forward pass (default: the token budget).
        command: the command line, for the report.

    Returns:
        A one-cell :class:`GridResult` (plus a raw-encoder cell for comparison).
    """
    started = time.perf_counter()
    encoder: SentenceEncoder = embedder.encoder
    embedder._require_fitted()
    root: Path | None = None
    if tasks is None:
        root = resolve_data_dir(data_dir)
        tasks = load_sts_tasks(task_names, root)
    pool = pooling_key(encoder.pooling.to_spec(), encoder.num_layers)
    sentences = list(dict.fromkeys(s for task in tasks.values() for s in task.eval_sentences()))
    t0 = time.perf_counter()
    table = EmbeddingTable(sentences, embed_cached(encoder, sentences, [pool], cache=cache, batch_size=batch_size))
    encode_seconds = time.perf_counter() - t0
    info = getattr(embedder, "fit_info", {}) or {}
    label = str(info.get("regime", "unknown"))
    note = (
        f"unknown: fitted beforehand on {info.get('n_sentences', '?')} sentences ({label!r}); "
        "bertflow cannot tell whether they include test sentences"
    )
    cells = []
    for spec, cal, regime in (("none", None, "none"), (embedder.calibrator.name, embedder.calibrator, label)):
        t1 = time.perf_counter()
        cell = CellResult(pool, spec, regime, [None], list(tasks), seen_note=None if cal is None else note)
        cell.test_seen = {t: None for t in tasks}
        cell.reports = [score_fitted(table, pool, cal, tasks)]
        cell.seconds = time.perf_counter() - t1
        cells.append(cell)
    meta = {
        "command": command,
        "model": _model_meta(encoder),
        "tasks": {t: {"n_pairs": task.n_eval_pairs, "subsets": list(task.eval_subsets)} for t, task in tasks.items()},
        "data_dir": str(root) if root else None,
        "poolings": [pool],
        "calibrators": [embedder.calibrator.name],
        "regimes": {label: f"saved fitting record: {json.dumps(info, sort_keys=True)}"},
        "seeds": 1,
        "flow": {"epochs": getattr(embedder.calibrator, "epochs", None)},
        "protocol": _PROTOCOL,
        "machine": machine_info(str(encoder.device)),
        **_run_record(started, encode_seconds, cells, len(sentences), cache),
    }
    return GridResult(meta, cells, published_for(encoder.model_id))


# -------------------------------------------------------------------------------------------------------
# Markdown
# -------------------------------------------------------------------------------------------------------


def _fmt(stat: Mapping[str, Any] | None, digits: int = 2) -> str:
    if stat is None:
        return "n/a"
    if stat["mean"] is None:
        return "nan"
    if stat.get("std") is not None:
        return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}"


def _delta(stat: Mapping[str, Any] | None, base: Mapping[str, Any] | None) -> str:
    if stat is None or base is None or stat["mean"] is None or base["mean"] is None:
        return ""
    return f"{stat['mean'] - base['mean']:+.2f}"


def _published_cell(rows: Sequence[PublishedResult]) -> str:
    parts = []
    for r in rows:
        value = r.average if r.average is not None else next(iter(r.scores.values()))
        what = "avg" if r.average is not None else "/".join(r.scores)
        parts.append(f"{value:.2f} ({r.protocol}, {what}; {r.source.split(',')[0]} {r.source.split(',')[-1].strip()})")
    return "; ".join(parts)


def _machine_line(m: Mapping[str, Any]) -> str:
    line = (
        f"{m['platform']}; {m['cpu']}; {m['usable_cpus']} usable of {m['cpu_count']} CPUs; "
        f"torch {m['torch']} ({m['torch_threads']} thread(s)), transformers {m['transformers']}; device {m['device']}"
    )
    return line + (f" ({m['gpu']})" if m.get("gpu") else "")


def _flow_options_text(flow: Mapping[str, Any]) -> str:
    """The flow settings a grid changed from the preset defaults, or the default wording."""
    changed = {k: v for k, v in flow.items() if k != "epochs"}
    if not changed:
        return "the official code's optimiser settings"
    return "changed from the preset: " + ", ".join(f"{k}={v}" for k, v in changed.items())


def _render_markdown(result: GridResult, *, title: str, subsets: bool) -> str:
    meta = result.meta
    model = meta["model"]
    tasks = list(meta["tasks"])
    n_tasks = len(tasks)
    avg_name = "Avg" if n_tasks == len(STS_TASKS) else f"Avg ({n_tasks} tasks)"
    lines = [f"# {title}: `{model['id']}`", ""]
    if meta.get("command"):
        lines += ["Command:", "", "```bash", meta["command"], "```", ""]
    secs = meta["seconds"]
    lines += [
        "| setting | value |",
        "|---|---|",
        f"| model | `{model['id']}` (fingerprint {model['fingerprint']}, {model['dim']} dims, "
        f"{model['layers']} layers, {model['dtype']}) |",
        f"| max_length | {model['max_length']} tokens |",
        "| tasks | " + ", ".join(f"{t} ({v['n_pairs']} pairs)" for t, v in meta["tasks"].items()) + " |",
        f"| metric | {meta['protocol']['metric']} |",
        f'| "all" | {meta["protocol"]["all"]} |',
        f'| "wmean" | {meta["protocol"]["wmean"]} |',
        f"| {avg_name} | {meta['protocol']['average']} |",
    ]
    for regime, text in meta["regimes"].items():
        lines.append(f"| regime `{regime}` | {text} |")
    lines += [
        *(
            [f"| seeds | {meta['seeds']} ({meta['protocol']['seeds']}) |"]
            if any(c.seeds != [None] for c in result.cells)
            else []
        ),
        *(
            [f"| flow training | {meta['flow']['epochs']:g} epoch(s), {_flow_options_text(meta['flow'])} |"]
            if meta["flow"].get("epochs") is not None
            else []
        ),
        f"| machine | {_machine_line(meta['machine'])} |",
        f"| wall time | {secs['total']:.0f} s in all: encoding {secs['encode']:.0f} s "
        f"({meta['sentences']['distinct']} distinct sentences, cache `{meta['cache']}`), "
        f"fitting and scoring {secs['cells']:.0f} s |",
        f"| started | {meta['started_at']} |",
        "",
    ]
    beside = bool(result.published)
    published = meta.get("published") or {"model": model["id"], "caption": None}
    caption = published.get("caption")
    lines += [
        "## Summary",
        "",
        f"Spearman × 100; {avg_name} is the plain mean over the {n_tasks} tasks. Δ: difference to the raw encoder "
        'with the same pooling. "test seen": how many evaluation sentences were in the calibrator\'s fitting set.',
        "",
        *([f"Last column: {caption}", ""] if caption and beside else []),
    ]
    head = f'| pooling | calibrator | regime | test seen | {avg_name} "all" | Δ | {avg_name} "wmean" | Δ | seconds |'
    sep = "|---|---|---|---|---:|---:|---:|---:|---:|"
    if beside:
        head += f" paper's {published['model']} (protocol; source) |" if caption else " published (protocol; source) |"
        sep += "---|"
    lines += [head, sep]
    for c in result.cells:
        raw = result.raw_cell(c.pooling)
        a_all, a_w = c.average_stat("all"), c.average_stat("wmean")
        b_all = raw.average_stat("all") if raw and raw is not c else None
        b_w = raw.average_stat("wmean") if raw and raw is not c else None
        cells = [
            c.pooling,
            c.calibrator,
            c.regime,
            c.seen_summary(),
            "error" if c.error else _fmt(a_all),
            _delta(a_all, b_all),
            "error" if c.error else _fmt(a_w),
            _delta(a_w, b_w),
            f"{c.seconds:.1f}",
        ]
        if beside:
            cells.append(_published_cell(matching(published["model"], c.pooling, c.calibrator, c.regime)))
        lines.append("| " + " | ".join(cells) + " |")
    errors = [c for c in result.cells if c.error]
    if errors:
        lines += ["", "Failed cells:", ""]
        lines += [f"- {c.pooling} / {c.calibrator} / {c.regime}: {c.error}" for c in errors]
    for protocol, text in (
        ("all", "one correlation over each task's concatenated subsets"),
        ("wmean", 'size-weighted mean of per-subset correlations; STS-B and SICK-R are identical to "all"'),
    ):
        lines += ["", f'## Per task, "{protocol}" ({text})', ""]
        lines.append("| pooling | calibrator | regime | " + " | ".join(tasks) + f" | {avg_name} |")
        lines.append("|---|---|---|" + "---:|" * (n_tasks + 1))
        for c in result.cells:
            if c.error:
                continue
            vals = [_fmt(c.task_stat(t, protocol)) for t in tasks]
            lines.append(
                f"| {c.pooling} | {c.calibrator} | {c.regime} | "
                + " | ".join(vals)
                + f" | {_fmt(c.average_stat(protocol))} |"
            )
    if subsets:
        lines += ["", "## Per subset (Spearman × 100)", ""]
        for c in result.cells:
            if c.error:
                continue
            lines += [
                f"### {c.pooling} / {c.calibrator} / {c.regime}",
                "",
                "| task | subset | pairs | Spearman |",
                "|---|---|---:|---:|",
            ]
            for t in c.evaluated():
                first = c.reports[0].tasks[t]
                for i, s in enumerate(first.subsets):
                    stat = _stat([r.tasks[t].subsets[i].spearman for r in c.reports])
                    lines.append(f"| {t} | {s.name} | {s.n_pairs} | {_fmt(stat)} |")
            lines.append("")
    if beside:
        lines += [
            "",
            f"## Published numbers for {result.published[0].model}",
            "",
            *([caption, ""] if caption else []),
            "Transcribed in `bertflow/evaluation/paper.py` from the cited tables. Compare a published row only with "
            'our row of the same protocol: "wmean" and "all" differ by up to 20 points on STS12.',
            "",
            "| published row | protocol | "
            + " | ".join(STS_TASKS)
            + " | Avg | ours: pooling / calibrator / regime | source |",
            "|---|---|" + "---:|" * (len(STS_TASKS) + 1) + "---|---|",
        ]
        for r in result.published:
            vals = [f"{r.scores[t]:.2f}" if t in r.scores else "" for t in STS_TASKS]
            avg = f"{r.average:.2f}" if r.average is not None else ""
            ours = f"{r.pooling} / {' or '.join(r.calibrators)} / {r.regime or 'not stated'}"
            note = f" ({r.note})" if r.note else ""
            lines.append(
                f"| {r.label} | {r.protocol} | " + " | ".join(vals) + f" | {avg} | {ours} | {r.source}{note} |"
            )
    return "\n".join(lines).rstrip() + "\n"


def _model_meta(encoder: SentenceEncoder) -> dict[str, Any]:
    """What a report records about the encoder: id, weight fingerprint, shape, truncation and precision."""
    return {
        "id": encoder.model_id,
        "fingerprint": encoder.fingerprint(),
        "dim": encoder.dim,
        "layers": encoder.num_layers,
        "max_length": encoder.max_length,
        "dtype": str(encoder.dtype).removeprefix("torch."),
    }
