"""STS evaluation of an encoder + calibrator, and the grid behind ``bertflow reproduce``.

A *cell* is one (pooling, calibrator, fitting regime) on one encoder: its calibrator is fitted without labels on
the regime's sentences (:mod:`bertflow.paper.regimes`) and the STS tasks are scored under both conventions. Every
sentence is encoded once for all poolings (:func:`encode_table`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..autofit import AutoInputs, fit_auto
from ..calibrators import Calibrator, parse_calibrator
from ..calibrators.auto import AutoCalibrator
from ..encoding.encoder import SentenceEncoder
from ..encoding.pooling import Pooling
from ..errors import BertflowError, InputError
from ..evaluation.cache import EmbeddingCache, embed_cached, pooling_key
from ..evaluation.datasets import STS_TASKS, StsTask, load_nli_sentences, load_sts_tasks, resolve_data_dir
from ..evaluation.sts import PROTOCOL_TEXT, StsReport, evaluate_task
from ..io.text import distinct
from ..resources import limited_threads, machine_info
from .autocells import encode_auto_inputs, is_auto, table_key
from .published import PAPER_MODELS, paper_model_name, published_for, stand_in_caption
from .regimes import DEFAULT_REGIMES, REGIME_TEXT, REGIMES, FittingSets, fitting_sets, seen_counts
from .render import format_stat
from .results import ALL_TASKS, CellResult, GridResult

logger = logging.getLogger(__name__)

#: Poolings of the default grid: all three come from one forward pass.
DEFAULT_POOLINGS = ("mean", "cls", "first-last-avg")

Progress = Callable[[str], None]

_PROTOCOL = {
    "metric": "Spearman × 100 of cosine similarity against the gold score (Pearson in the JSON)",
    **PROTOCOL_TEXT,
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
    return ["none", "standard-norm", f"natsv-{natsv}", f"standard-norm+natsv-{min(6, natsv)}", "whitening",
            f"whitening-{k}", "flow", "flow-paper"]  # fmt: skip


def is_seeded(spec: str) -> bool:
    """Whether a calibrator spec contains a flow (whose fit depends on a seed)."""
    return any(p.strip().lower().startswith("flow") for p in spec.split("+"))


def is_identity(spec: str) -> bool:
    """Whether a calibrator spec is the raw encoder (``none``, ``raw``, ``identity``)."""
    return spec.strip().lower() in ("none", "raw", "identity")


def seeds_of(spec: str, n_seeds: int) -> list[int | None]:
    """The seeds a cell of ``spec`` is fitted with: ``0 .. n_seeds-1`` for a flow, else ``[None]`` (fitted once)."""
    return list(range(n_seeds)) if is_seeded(spec) else [None]


class EmbeddingTable:
    """Raw embeddings of N distinct ``sentences`` under several poolings: ``{pooling_key: float32 [N, D]}``, rows in
    the order of ``sentences``."""

    def __init__(self, sentences: Sequence[str], embeddings: Mapping[str, np.ndarray]) -> None:
        self.index = {s: i for i, s in enumerate(sentences)}
        self.embeddings = dict(embeddings)

    def get(self, pooling: str, sentences: Sequence[str]) -> np.ndarray:
        """Rows for ``sentences`` (each must be in the table) under ``pooling``: float32 [len(sentences), D]."""
        rows = np.fromiter((self.index[s] for s in sentences), dtype=np.int64, count=len(sentences))
        return self.embeddings[pooling][rows]


@dataclass
class Encoded:
    """A run's embeddings: the table, the ``auto`` rule's inputs by pooling key, the cache and the seconds spent."""

    table: EmbeddingTable
    auto: dict[str, AutoInputs]
    cache: EmbeddingCache | None
    seconds: float


def encode_table(
    encoder: SentenceEncoder,
    sentences: list[str],
    poolings: Sequence[Pooling | str],
    cache: EmbeddingCache | None,
    batch_size: int | None,
    *,
    auto_for: Sequence[Pooling] = (),
    say: Progress | None = None,
) -> Encoded:
    """Encode the distinct ``sentences`` once for all ``poolings`` (through ``cache``), and what the ``auto`` rule
    reads for the poolings ``auto_for`` (:mod:`bertflow.paper.autocells`)."""
    say = say or (lambda _msg: None)
    keys = [pooling_key(p, encoder.num_layers) for p in poolings]
    say(f"encoding {len(sentences)} distinct sentences with {encoder.model_id} ({', '.join(keys)})")
    t0 = time.perf_counter()
    extra = ["mean"] if auto_for and "mean" not in keys else []  # auto's token anisotropy, same pass
    embedded = embed_cached(encoder, sentences, [*poolings, *extra], cache=cache, batch_size=batch_size)
    table = EmbeddingTable(sentences, embedded)
    auto = encode_auto_inputs(encoder, auto_for, sentences, table, cache=cache, batch_size=batch_size)
    seconds = time.perf_counter() - t0
    say(f"encoded in {seconds:.1f} s")
    return Encoded(table, auto, cache, seconds)


def fit_cell(
    spec: str,
    flow_kwargs: Mapping[str, Any],
    seed: int | None,
    rows: Callable[[str], np.ndarray],
    pooling: str,
    auto: AutoInputs | None,
) -> tuple[Calibrator, str, dict[str, Any] | None]:
    """Fit ``spec`` (with the flow's keyword arguments and ``seed``) on the fitting rows ``rows(table key)`` gives:
    the calibrator, the table key to score under (``pooling``, or for ``auto`` with its inputs ``auto`` the pooling
    its rule chose, as ``Embedder.fit`` would) and ``auto``'s choice (else ``None``)."""
    cal = parse_calibrator(spec, **(flow_kwargs if seed is None else {**flow_kwargs, "seed": seed}))
    if auto is not None and isinstance(cal, AutoCalibrator):
        fit = fit_auto(cal, auto, lambda p: rows(table_key(auto, p)))
        return cal, table_key(auto, fit.pooling), fit.choice
    return cal.fit(rows(pooling)), pooling, None


def score_fitted(
    table: EmbeddingTable,
    pooling: str,
    calibrator: Calibrator | None,
    tasks: Mapping[str, StsTask],
    *,
    device: str | None = None,
) -> StsReport:
    """Score ``tasks`` (both conventions, per subset) with an already-fitted calibrator (``None``: raw embeddings) on
    cached embeddings. ``device=None`` applies ``calibrator.transform`` (float64 on the host, as the grid fits and
    scores); a device applies it as :meth:`Embedder.encode` does (float32 ``torch_transform`` there), so that
    ``evaluate --model-dir`` scores what the saved model's ``encode`` returns."""

    def embed(sentences: list[str]) -> np.ndarray:
        raw = table.get(pooling, sentences)
        if calibrator is None:
            return raw
        if device is None:
            return calibrator.transform(raw)
        import torch

        from ..calibrators.device import fast_torch_transform

        transform = fast_torch_transform(calibrator, device)
        with torch.inference_mode():
            return transform(torch.from_numpy(raw).to(device)).float().cpu().numpy()

    return StsReport({name: evaluate_task(task, embed) for name, task in tasks.items()})


def _run_cell(
    table: EmbeddingTable,
    pooling: str,
    spec: str,
    fits: FittingSets,
    tasks: Mapping[str, StsTask],
    seeds: Sequence[int | None],
    flow_kwargs: Mapping[str, Any],
    auto: AutoInputs | None = None,
) -> CellResult:
    """Fit ``spec`` under ``fits`` for each seed and score every task it applies to (``auto``: the inputs of the
    ``auto`` rule for this pooling)."""
    started = time.perf_counter()
    cell = CellResult(pooling, spec, fits.regime, list(seeds), list(tasks))
    applicable = {t: task for t, task in tasks.items() if fits.per_task[t] is not None}
    cell.test_seen = {t: None if fits.regime == "none" else seen_counts(fits.per_task[t], task.eval_sentences())
                      for t, task in tasks.items()}  # fmt: skip
    # (name of the fit, its sentences, the tasks it scores): none, one shared fit, or one fit per task.
    if fits.regime == "none":
        groups: list[tuple[str | None, list[str], Mapping[str, StsTask]]] = [(None, [], applicable)]
    elif fits.shared:
        groups = [(ALL_TASKS, next(iter(fits.per_task.values())) or [], applicable)]
    else:
        groups = [(t, fits.per_task[t] or [], {t: task}) for t, task in applicable.items()]
    try:
        for seed in seeds:
            scores = {}
            for name, sentences, scored in groups:
                cal, key = None, pooling
                if name is not None:
                    rows = lambda k, s=sentences: table.get(k, s)  # noqa: E731
                    cal, key, choice = fit_cell(spec, flow_kwargs, seed, rows, pooling, auto)
                    cell.auto.update({name: choice} if choice else {})
                scores.update(score_fitted(table, key, cal, scored).tasks)
            cell.reports.append(StsReport(scores))
    except BertflowError as e:
        cell.reports = []
        cell.error = f"{type(e).__name__}: {e}"
        logger.warning("%s / %s / %s failed: %s", pooling, spec, fits.regime, cell.error)
    cell.seconds = time.perf_counter() - started
    return cell


@dataclass
class GridConfig:
    """What ``bertflow reproduce`` (and ``bertflow evaluate``) runs.

    ``model``: hub id or folder (``None``: the embedded all-MiniLM-L6-v2); ``calibrators``: specs (``None``:
    :func:`default_calibrators` for the model's dimension); ``regimes``: a subset of :data:`REGIMES`, or
    ``["per-set"]`` alone (:func:`bertflow.paper.perset.run_per_set`); ``seeds``: flow rows are fitted with seeds
    ``0 .. seeds-1``; ``corpus``: the ``corpus`` regime's sentences, ``corpus_name`` in reports; ``data_dir``: the
    STS data folder, required unless the tasks (and NLI sentences) are handed to the run; ``flow_options``: further
    :class:`~bertflow.calibrators.FlowCalibrator` arguments for every flow cell (ablations; the seed is the grid's);
    ``paper_rows``: a paper model whose published rows are shown beside this encoder's (``None``: only when the
    encoder is that model); ``fit_threads``: BLAS threads while fitting and scoring (``None``: the library default;
    1 by default: on a busy 2-core machine a multi-threaded SVD of these small matrices waited on barriers, 11x
    slower); ``fit_sizes``, ``sample_seed``: per-set regime only; ``command``: the command line of the run.
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
    fit_sizes: Sequence[int] = ()
    sample_seed: int = 0
    command: str | None = None

    def cache(self) -> EmbeddingCache | None:
        """The run's embedding cache (``None`` with ``use_cache=False``)."""
        return EmbeddingCache(self.cache_dir) if self.use_cache else None

    def flow_meta(self, specs: Sequence[str]) -> dict[str, Any]:
        """The flow settings a report records (empty when no spec has a flow)."""
        return {"epochs": self.flow_epochs, **self.flow_options} if any(is_seeded(s) for s in specs) else {}


def checked_specs(config: GridConfig, dim: int) -> tuple[list[str], dict[str, Any]]:
    """The calibrator specs of ``config`` (default: :func:`default_calibrators` for ``dim``) and the keyword arguments
    of every flow, each spec parsed once so that an unknown spec or flow option fails before any encoding."""
    specs = list(dict.fromkeys(config.calibrators or default_calibrators(dim)))
    if "seed" in config.flow_options:
        raise InputError("flow_options must not set the seed: the grid's seeds are 0 .. seeds-1")
    flow_kwargs: dict[str, Any] = {**config.flow_options, "epochs": config.flow_epochs, "device": config.device}
    for spec in specs:
        try:
            parse_calibrator(spec, **(flow_kwargs if is_seeded(spec) else {}))
        except TypeError as e:
            raise InputError(f"bad flow option for {spec!r}: {e}") from None
    return specs, flow_kwargs


def encoder_and_poolings(config: GridConfig, encoder: SentenceEncoder | None) -> tuple[SentenceEncoder, list[Pooling]]:
    """The run's encoder (``encoder``, else ``config.model`` loaded) and its distinct poolings, parsed on it;
    InputError for an unknown pooling, or none."""
    if encoder is None:
        encoder = SentenceEncoder(config.model, max_length=config.max_length, device=config.device, dtype=config.dtype)
    poolings = list({p.key: p for p in (Pooling.parse(s, encoder.num_layers) for s in config.poolings)}.values())
    if not poolings:
        raise InputError("give at least one pooling")
    return encoder, poolings


def loaded_tasks(config: GridConfig, tasks: Mapping[str, StsTask] | None) -> tuple[dict[str, StsTask], Path | None]:
    """``tasks``, or ``config.tasks`` read from ``config.data_dir`` (then also that folder, else ``None``), in the
    papers' column order whatever order they were named in."""
    data_dir: Path | None = None
    if tasks is None:
        data_dir = resolve_data_dir(config.data_dir)
        tasks = load_sts_tasks(config.tasks, data_dir)
    order = {name: i for i, name in enumerate(STS_TASKS)}
    return dict(sorted(tasks.items(), key=lambda kv: order.get(kv[0], len(STS_TASKS)))), data_dir


def run_meta(
    encoder: SentenceEncoder,
    tasks: Mapping[str, StsTask],
    data_dir: Path | None,
    encoded: Encoded,
    cells: Sequence[Any],
    *,
    command: str | None,
    device: str | None,
    started: float,
    **middle: Any,
) -> dict[str, Any]:
    """A run's metadata: the command, the encoder (id, weight fingerprint, shape, truncation, precision), the tasks'
    pair counts and subsets, ``middle`` (what the run was), the machine, and how long it took on how many
    sentences, from which cache."""
    elapsed = time.perf_counter() - started
    return {
        "command": command,
        "model": {"id": encoder.model_id, "fingerprint": encoder.fingerprint(), "dim": encoder.dim,
                  "layers": encoder.num_layers, "max_length": encoder.max_length,
                  "dtype": str(encoder.dtype).removeprefix("torch.")},
        "tasks": {t: {"n_pairs": task.n_eval_pairs, "subsets": list(task.eval_subsets)} for t, task in tasks.items()},
        "data_dir": str(data_dir) if data_dir else None,
        **middle,
        "machine": machine_info(device),
        "seconds": {"total": round(elapsed, 1), "encode": round(encoded.seconds, 1),
                    "cells": round(sum(c.seconds for c in cells), 1)},
        "sentences": {"distinct": len(encoded.table.index)},
        "cache": str(encoded.cache.root) if encoded.cache else None,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - elapsed)),
    }  # fmt: skip


def run_grid(
    config: GridConfig,
    *,
    encoder: SentenceEncoder | None = None,
    tasks: Mapping[str, StsTask] | None = None,
    nli: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> GridResult:
    """Run a pooling x calibrator x regime grid on one encoder: ``encoder`` instead of ``config.model`` (its pooling
    is ignored), ``tasks`` and ``nli`` sentences instead of reading them from ``config.data_dir``. Cells whose fit
    failed carry an ``error`` instead of scores. InputError for bad options before any encoding."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    regimes = _checked_regimes(config)
    encoder, parsed = encoder_and_poolings(config, encoder)
    specs, flow_kwargs = checked_specs(config, encoder.dim)
    if all(is_identity(s) for s in specs):
        regimes = []  # nothing is fitted, so no fitting sentences need encoding
    tasks, data_dir = loaded_tasks(config, tasks)
    nli_sentences: list[str] | None = None
    if "nli" in regimes:
        nli_sentences = list(nli) if nli is not None else load_nli_sentences(data_dir or config.data_dir)
    corpus = distinct(config.corpus) if config.corpus else None
    fit_by_regime = {
        r: fitting_sets(r, tasks, nli=nli_sentences, corpus=corpus, corpus_name=config.corpus_name) for r in regimes
    }
    needed = [s for task in tasks.values() for s in task.eval_sentences()]
    needed += [s for fits in fit_by_regime.values() for sentences in fits.per_task.values() for s in sentences or []]
    auto_for = parsed if any(is_auto(s) for s in specs) else []
    encoded = encode_table(encoder, distinct(needed), parsed, config.cache(), config.batch_size, auto_for=auto_for,
                           say=say)  # fmt: skip
    # Every (pooling, calibrator, regime) cell, in that order (the raw encoder once per pooling, unfitted).
    no_fit = [fitting_sets("none", tasks)]
    plan = [(p.key, spec, fits) for p in parsed for spec in specs
            for fits in (no_fit if is_identity(spec) else fit_by_regime.values())]  # fmt: skip
    cells: list[CellResult] = []
    for i, (pooling, spec, fits) in enumerate(plan, start=1):
        auto = encoded.auto.get(pooling) if is_auto(spec) else None
        with limited_threads(blas_threads=config.fit_threads):
            cell = _run_cell(encoded.table, pooling, spec, fits, tasks, seeds_of(spec, config.seeds), flow_kwargs, auto)
        cells.append(cell)
        shown = "error" if cell.error else format_stat(cell.average_stat("all"))
        say(f"[{i}/{len(plan)}] {pooling} / {spec} / {fits.regime}: avg all {shown} ({cell.seconds:.1f} s)")
    regime_text = {"none": REGIME_TEXT["none"]} if any(is_identity(s) for s in specs) else {}
    meta = run_meta(
        encoder, tasks, data_dir, encoded, cells, command=config.command, device=config.device, started=started,
        poolings=[p.key for p in parsed], calibrators=specs,
        regimes={**regime_text, **{r: fits.description for r, fits in fit_by_regime.items()}},
        seeds=config.seeds, flow=config.flow_meta(specs), fit_threads=config.fit_threads,
        published=_published_meta(encoder, config.paper_rows), protocol=_PROTOCOL,
    )  # fmt: skip
    return GridResult(meta, cells, published_for(meta["published"]["model"] or ""))


def _checked_regimes(config: GridConfig) -> list[str]:
    """The grid's regimes, lower case and distinct, after every check of ``config`` that needs no encoder."""
    if config.seeds < 1:
        raise InputError(f"seeds must be at least 1, got {config.seeds}")
    regimes = list(dict.fromkeys(r.strip().lower() for r in config.regimes))
    if "per-set" in regimes:
        raise InputError("the per-set regime has a report of its own: run it with bertflow.paper.perset.run_per_set")
    if config.fit_sizes:
        raise InputError("fit sizes belong to the per-set regime (regimes=['per-set'])")
    for r in regimes:
        if r not in REGIMES:
            raise InputError(f"unknown regime {r!r}; use one of {', '.join(REGIMES)}")
    if "corpus" in regimes and not config.corpus:
        raise InputError("the corpus regime needs a corpus file (--corpus FILE)")
    if config.paper_rows is not None and config.paper_rows not in PAPER_MODELS:
        raise InputError(f"no published rows for {config.paper_rows!r}; use one of {', '.join(PAPER_MODELS)}")
    return regimes


def _published_meta(encoder: SentenceEncoder, paper_rows: str | None) -> dict[str, Any]:
    """Whose published rows a report shows: the encoder's own if the papers evaluated it, else ``paper_rows``'s
    with a caption saying how that model differs from the encoder."""
    own = paper_model_name(encoder.model_id)
    if own is not None or paper_rows is None:
        return {"model": own, "caption": None}
    caption = stand_in_caption(paper_rows, encoder.model_id, encoder.num_layers, encoder.dim)
    return {"model": paper_rows, "caption": caption}


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
    """Score a fitted :class:`~bertflow.embedder.Embedder` (e.g. loaded from ``bertflow fit``) on STS tasks
    (``tasks``, else ``task_names`` read from ``data_dir``): a one-cell :class:`GridResult` plus a raw-encoder cell.

    The calibrator is used as saved; its fitting corpus is not known here, so the report quotes the saved fitting
    record (regime label, sentence count) instead of claiming whether test sentences were seen.
    """
    started = time.perf_counter()
    encoder: SentenceEncoder = embedder.encoder
    embedder.check_fitted()
    tasks, root = loaded_tasks(GridConfig(tasks=task_names, data_dir=data_dir), tasks)
    pool = pooling_key(encoder.pooling.to_spec(), encoder.num_layers)
    sentences = distinct(s for task in tasks.values() for s in task.eval_sentences())
    encoded = encode_table(encoder, sentences, [pool], cache, batch_size)
    info = embedder.fit_info
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
        cell.reports = [score_fitted(encoded.table, pool, cal, tasks, device=str(encoder.device))]
        cell.seconds = time.perf_counter() - t1
        cells.append(cell)
    meta = run_meta(
        encoder, tasks, root, encoded, cells, command=command, device=str(encoder.device), started=started,
        poolings=[pool], calibrators=[embedder.calibrator.name],
        regimes={label: f"saved fitting record: {json.dumps(info, sort_keys=True)}"},
        seeds=1, flow={"epochs": getattr(embedder.calibrator, "epochs", None)}, protocol=_PROTOCOL,
    )  # fmt: skip
    return GridResult(meta, cells, published_for(encoder.model_id))
