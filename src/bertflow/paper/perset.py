"""The per-set protocol: every evaluation set scored on its own, its calibrator fitted on that set's own sentences.

``bertflow reproduce --regimes per-set`` (and ``bertflow evaluate --regime per-set``) split the seven STS tasks
into their evaluation sets: every STS12-16 subset (``STS12/MSRpar``, ``STS16/headlines`` ...), STS-B test and
SICK-R test. Each set's calibrator is fitted, without labels, on that set's own distinct sentences (STS-B and
SICK-R: all their splits' sentences, as the ``target`` regime does; a STS12-16 subset: that subset's sentences),
which is how ``bertflow fit`` is used on a user's own data. With ``fit_sizes`` it is also fitted on seeded random
samples of that many of the set's sentences (only for sets with more sentences than that) and scores the same
pairs: small fitting sets. A frequency-weighted pooling (``sif:first-last-avg``) takes its token statistics from
the same fitting sample.

Each configuration is summarised against the **raw encoder** (the same encoder and pooling, without weighting or
calibrator): the mean over sets, the worst set relative to raw and the number of sets more than 2 points below raw
(:func:`bertflow.paper.results.summarize_sets`). Choosing among configurations without tuning on the set
that is scored: :mod:`bertflow.paper.lodo`.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..autofit import AutoInputs
from ..calibrators import parse_calibrator
from ..calibrators.auto import AutoCalibrator
from ..encoding.encoder import SentenceEncoder
from ..encoding.pooling import Pooling
from ..errors import BertflowError, InputError
from ..evaluation.cache import EmbeddingCache, embed_cached
from ..evaluation.datasets import StsTask
from ..evaluation.sts import evaluate_pairs
from ..io.text import SentencePairs, distinct
from ..resources import limited_threads, machine_info
from .autocells import encode_auto_inputs, fit_auto_cell, is_auto
from .grid import (
    EmbeddingTable,
    GridConfig,
    checked_specs,
    encoder_and_poolings,
    is_identity,
    is_seeded,
    loaded_tasks,
    model_meta,
    run_record,
    task_meta,
)
from .regimes import seen_counts
from .results import HARM_MARGIN, PerSetCell, PerSetResult, fit_size_label

__all__ = ["PER_SET", "PER_SET_TEXT", "EvalSet", "evaluation_sets", "fitting_sample", "run_per_set"]

#: The regime name of the per-set protocol (``--regimes per-set``).
PER_SET = "per-set"

PER_SET_TEXT = (
    "each evaluation set (every STS12-16 subset, STS-B test, SICK-R test) scored on its own, its calibrator fitted "
    "on that set's own distinct sentences (STS-B/SICK-R: all their splits; a STS12-16 subset: that subset), or on a "
    "seeded random sample of them (fit size n); transductive, as `bertflow fit` on one's own data"
)

_PROTOCOL = {
    "metric": "Spearman × 100 of cosine similarity against the gold score, per evaluation set",
    "raw": "the same encoder and pooling without weighting or calibrator (base pooling, no token statistics)",
    "weighted raw": "for a weighted pooling: the same weighted pooling without calibrator, its token statistics "
    "from the same fitting sample",
    "mean": "plain mean over the sets scored at that fit size",
    "worst": "the set with the lowest score minus raw, and that difference",
    "count": f"number of sets whose score is more than {HARM_MARGIN:g} points below raw",
    "seeds": "flow rows: per set the mean over seeds 0..N-1",
    "samples": "fit size n: a seeded sample of n of the set's distinct sentences (nested: the first n of one "
    "random permutation per set); sets with n sentences or fewer are not scored at that size",
}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set of the per-set protocol.

    Attributes:
        name: ``"STS12/MSRpar"`` for a STS12-16 subset, ``"STS-B"`` / ``"SICK-R"`` for their test split.
        dataset: the task it belongs to (``"STS12"`` ... ``"SICK-R"``): the unit left out by
            :mod:`bertflow.paper.lodo`.
        pairs: the scored pairs.
        sentences: the set's own distinct sentences, the fitting pool (for STS-B and SICK-R all splits).
    """

    name: str
    dataset: str
    pairs: SentencePairs
    sentences: tuple[str, ...]

    def eval_sentences(self) -> list[str]:
        """Distinct sentences of the scored pairs."""
        return distinct(self.pairs.sentences())


def evaluation_sets(tasks: Mapping[str, StsTask]) -> list[EvalSet]:
    """The evaluation sets of ``tasks``, in task order and each task's subset order."""
    out = []
    for name, task in tasks.items():
        if task.has_train_split:
            out.append(EvalSet(name, name, task.eval_subsets["test"], tuple(task.fit_sentences("target"))))
            continue
        for subset, pairs in task.eval_subsets.items():
            out.append(EvalSet(f"{name}/{subset}", name, pairs, tuple(distinct(pairs.sentences()))))
    return out


def fitting_sample(eval_set: EvalSet, fit_size: int | None, seed: int = 0) -> list[str] | None:
    """The sentences ``eval_set``'s calibrator is fitted on at ``fit_size``.

    Args:
        eval_set: the set.
        fit_size: ``None`` for all of its sentences, else the sample size.
        seed: the sampling seed; with the set's name it fixes one random permutation per set, and a sample of n is
            its first n entries (so samples are nested across sizes), returned in the set's sentence order.

    Returns:
        The sample, or ``None`` when the set has ``fit_size`` sentences or fewer (it is not scored at that size).
    """
    pool = eval_set.sentences
    if fit_size is None:
        return list(pool)
    if len(pool) <= fit_size:
        return None
    rng = np.random.default_rng([seed, zlib.crc32(eval_set.name.encode("utf-8"))])
    chosen = np.sort(rng.permutation(len(pool))[:fit_size])
    return [pool[i] for i in chosen]


def _check_fit_sizes(sizes: Sequence[int]) -> list[int]:
    out = []
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
            raise InputError(f"fit sizes must be whole numbers of at least 2 sentences, got {n!r}")
        out.append(int(n))
    return sorted(set(out))


def _spearman(eval_set: EvalSet, embed: Callable[[list[str]], np.ndarray]) -> float:
    return evaluate_pairs(eval_set.name, {eval_set.name: eval_set.pairs}, embed).subsets[0].spearman


class _Cells:
    """The cells of a run keyed by (pooling, calibrator, fit size), created on first use."""

    def __init__(self, seeds: int) -> None:
        self.n_seeds = seeds
        self.by_key: dict[tuple[str, str, int | None], PerSetCell] = {}

    def get(self, pooling: Pooling, base: str, spec: str, fit_size: int | None) -> PerSetCell:
        key = (pooling.key, spec, fit_size)
        if key not in self.by_key:
            seeds: list[int | None] = list(range(self.n_seeds)) if is_seeded(spec) else [None]
            self.by_key[key] = PerSetCell(pooling.key, base, spec, fit_size, seeds)
        return self.by_key[key]


Lookup = Callable[[str, list[str]], np.ndarray]
"""``lookup(pooling key, sentences)``: their embeddings [N, D] under that pooling (any key of the run's tables)."""


def _fit_and_score(
    cell: PerSetCell,
    eval_set: EvalSet,
    sample: list[str],
    lookup: Lookup,
    flow_kwargs: Mapping[str, Any],
    auto: AutoInputs | None = None,
) -> None:
    """Fit ``cell``'s calibrator on ``sample`` (every seed) and record the set's Spearman; a failure fails the cell.
    ``auto``: the ``auto`` rule's inputs for the cell's pooling (it may then score another pooling, as
    ``Embedder.fit`` would)."""
    if cell.error:
        return
    started = time.perf_counter()
    try:
        values = []
        for seed in cell.seeds:
            if cell.calibrator == "none":
                values.append(_spearman(eval_set, lambda s: lookup(cell.pooling, s)))
                continue
            kwargs = dict(flow_kwargs) if seed is None else {**flow_kwargs, "seed": seed}
            cal = parse_calibrator(cell.calibrator, **kwargs)
            key = cell.pooling
            if auto is not None and isinstance(cal, AutoCalibrator):
                key, cell.auto[eval_set.name] = fit_auto_cell(cal, auto, lambda k: lookup(k, sample))
            else:
                cal.fit(lookup(key, sample))
            values.append(_spearman(eval_set, lambda s, cal=cal, key=key: cal.transform(lookup(key, s))))
        cell.runs[eval_set.name] = values
    except BertflowError as e:
        cell.error = f"{eval_set.name}: {type(e).__name__}: {e}"
        cell.runs = {}
    cell.seconds += time.perf_counter() - started


@dataclass
class _Plan:
    """What a run scores: the poolings (unweighted ones read from ``table``), the calibrators and their cells."""

    encoder: SentenceEncoder
    config: GridConfig
    table: EmbeddingTable
    plain: list[Pooling]
    weighted: list[Pooling]
    base_of: dict[str, Pooling]
    specs: list[str]
    flow_kwargs: dict[str, Any]
    cache: EmbeddingCache | None
    cells: _Cells
    auto: dict[str, AutoInputs]

    def score_set(self, es: EvalSet, sample: list[str], size: int | None) -> float:
        """Fit every cell of ``size`` on ``sample`` and score ``es``; returns the seconds spent encoding."""
        local: dict[str, EmbeddingTable] = {}  # weighted poolings, counted on this sample: their own table
        seconds = 0.0
        if self.weighted:
            # The token statistics of a weighted pooling come from this fitting sample, as Embedder.fit does.
            t0 = time.perf_counter()
            self.encoder.token_statistics = self.encoder.count_tokens(sample)
            items = distinct([*es.eval_sentences(), *sample])
            own = embed_cached(self.encoder, items, self.weighted, cache=self.cache, batch_size=self.config.batch_size)
            local.update(dict.fromkeys(own, EmbeddingTable(items, own)))
            seconds = time.perf_counter() - t0

        def lookup(key: str, items: list[str]) -> np.ndarray:
            return local.get(key, self.table).get(key, items)

        with limited_threads(blas_threads=self.config.fit_threads):
            for p in [*self.plain, *self.weighted]:
                base = self.base_of.get(p.key, p).key
                if size is None or p.weighting.weighted:  # an unweighted raw row does not depend on the size
                    _fit_and_score(self.cells.get(p, base, "none", size), es, sample, lookup, self.flow_kwargs)
                if p.key in self.base_of:  # a pooling that was asked for (not only a weighted one's base)
                    for spec in self.specs:
                        auto = self.auto.get(p.key) if is_auto(spec) else None
                        cell = self.cells.get(p, base, spec, size)
                        _fit_and_score(cell, es, sample, lookup, self.flow_kwargs, auto)
        return seconds


def run_per_set(
    config: GridConfig,
    *,
    encoder: SentenceEncoder | None = None,
    tasks: Mapping[str, StsTask] | None = None,
    progress: Progress | None = None,
) -> PerSetResult:
    """Run the per-set protocol for every pooling x calibrator x fitting-set size of ``config``.

    ``config.regimes`` must be ``["per-set"]``; ``config.fit_sizes`` adds sample sizes to "all" and
    ``config.sample_seed`` seeds the samples. The raw encoder of every pooling's unweighted base is always scored
    (it is the baseline), and every weighted pooling's uncalibrated row at every size. An ``auto`` cell fits the
    rule as ``Embedder.fit`` does (:mod:`bertflow.paper.autocells`) and records its choice per set.

    Args:
        config: the run (see :class:`~bertflow.paper.grid.GridConfig`).
        encoder: an already-built encoder instead of ``config.model``. Its own pooling is ignored, and its token
            statistics are set per fitting sample while a weighted pooling is encoded, then restored.
        tasks: already-loaded tasks instead of reading ``config.tasks`` from ``config.data_dir``.
        progress: called with one line per finished step.

    Raises:
        InputError: another regime, a bad fit size, unknown pooling or calibrator, ``seeds < 1``, no data folder
            (``config.data_dir``) when ``tasks`` are not given.
        DataNotFoundError: the STS data is missing.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    sizes = _checked_sizes(config)
    encoder, poolings = encoder_and_poolings(config, encoder)
    specs, flow_kwargs = checked_specs(config, encoder.dim)
    specs = [s for s in specs if not is_identity(s)]
    tasks, data_dir = loaded_tasks(config, tasks)
    sets = evaluation_sets(tasks)
    plan, everything, encode_seconds = _encode_sets(encoder, config, poolings, specs, flow_kwargs, sets, say)
    fits, weighted_seconds = _score_sets(plan, sets, sizes, say)
    encode_seconds += weighted_seconds
    result_cells = list(plan.cells.by_key.values())
    meta = {
        "command": config.command,
        "model": model_meta(encoder),
        "tasks": task_meta(tasks),
        "data_dir": str(data_dir) if data_dir else None,
        "poolings": [p.key for p in poolings],
        "calibrators": ["none", *specs],
        "regimes": {PER_SET: PER_SET_TEXT},
        "fit_sizes": [fit_size_label(s) for s in sizes],
        "sample_seed": config.sample_seed,
        "seeds": config.seeds,
        "flow": {"epochs": config.flow_epochs, **config.flow_options} if any(is_seeded(s) for s in specs) else {},
        "fit_threads": config.fit_threads,
        "protocol": _PROTOCOL,
        "machine": machine_info(config.device),
        **run_record(started, encode_seconds, result_cells, len(everything), plan.cache),
    }
    info = {es.name: {"dataset": es.dataset, "n_pairs": len(es.pairs), "n_sentences": len(es.sentences)} for es in sets}
    return PerSetResult(meta, info, fits, result_cells)


def _checked_sizes(config: GridConfig) -> list[int | None]:
    """The fit sizes of a run, ``None`` (all of a set's sentences) first, after the checks needing no encoder."""
    regimes = [r.strip().lower() for r in config.regimes]
    if regimes != [PER_SET]:
        raise InputError(f"the per-set protocol runs alone: give regimes [{PER_SET!r}], got {list(config.regimes)}")
    if config.seeds < 1:
        raise InputError(f"seeds must be at least 1, got {config.seeds}")
    return [None, *_check_fit_sizes(config.fit_sizes)]


def _encode_sets(
    encoder: SentenceEncoder,
    config: GridConfig,
    poolings: list[Pooling],
    specs: list[str],
    flow_kwargs: dict[str, Any],
    sets: list[EvalSet],
    say: Progress,
) -> tuple[_Plan, list[str], float]:
    """Encode every set's sentences once under every unweighted pooling (and what ``auto`` cells read); the plan
    that scores them, the sentences and the seconds spent."""
    base_of = {p.key: Pooling.parse(p.base_spec(), encoder.num_layers) for p in poolings}
    plain = list({b.key: b for b in base_of.values()}.values())  # every unweighted pooling: one encoder pass
    weighted = [p for p in poolings if p.weighting.weighted]
    cache = EmbeddingCache(config.cache_dir) if config.use_cache else None
    everything = distinct(s for es in sets for s in es.sentences)
    say(f"encoding {len(everything)} distinct sentences with {encoder.model_id} ({', '.join(p.key for p in plain)})")
    t0 = time.perf_counter()
    auto = any(is_auto(s) for s in specs)
    extra = ["mean"] if auto and "mean" not in {p.key for p in plain} else []  # auto's token anisotropy, same pass
    embedded = embed_cached(encoder, everything, [*plain, *extra], cache=cache, batch_size=config.batch_size)
    table = EmbeddingTable(everything, embedded)
    inputs: dict[str, AutoInputs] = {}
    if auto:
        inputs = encode_auto_inputs(encoder, poolings, everything, table, cache=cache, batch_size=config.batch_size)
    cells = _Cells(config.seeds)
    plan = _Plan(encoder, config, table, plain, weighted, base_of, specs, flow_kwargs, cache, cells, inputs)
    return plan, everything, time.perf_counter() - t0


def _score_sets(
    plan: _Plan, sets: list[EvalSet], sizes: list[int | None], say: Progress
) -> tuple[dict[str, dict[str, dict[str, Any] | None]], float]:
    """Fit and score every set at every size. Returns what each set was fitted on (by set, then size label) and the
    seconds spent encoding weighted poolings; the encoder's token statistics are restored afterwards."""
    fits: dict[str, dict[str, dict[str, Any] | None]] = {es.name: {} for es in sets}
    seconds = 0.0
    own_stats = plan.encoder.token_statistics
    try:
        for size in sizes:
            for es in sets:
                sample = fitting_sample(es, size, plan.config.sample_seed)
                label = fit_size_label(size)
                fits[es.name][label] = None if sample is None else {
                    "n_fit": len(sample), "seen": seen_counts(sample, es.eval_sentences())
                }  # fmt: skip
                if sample is not None:
                    seconds += plan.score_set(es, sample, size)
                    say(f"fit {label}: {es.name} ({len(sample)} sentences) done")
    finally:
        plan.encoder.token_statistics = own_stats
    return fits, seconds
