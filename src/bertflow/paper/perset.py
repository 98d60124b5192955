"""The per-set protocol (``--regimes per-set``): every evaluation set (each STS12-16 subset, STS-B test, SICK-R
test) scored on its own, its calibrator fitted on that set's own sentences or a seeded sample of them (``fit_sizes``),
and summarised against the raw encoder (:func:`bertflow.paper.results.summarize_sets`). Choosing among its
configurations without tuning on the scored set: :mod:`bertflow.paper.lodo`."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..encoding.encoder import SentenceEncoder
from ..encoding.pooling import Pooling
from ..errors import BertflowError, InputError
from ..evaluation.cache import embed_cached
from ..evaluation.datasets import StsTask
from ..evaluation.sts import evaluate_pairs
from ..io.text import SentencePairs, distinct
from ..resources import limited_threads
from .autocells import is_auto
from .grid import (
    EmbeddingTable,
    Encoded,
    GridConfig,
    Progress,
    checked_specs,
    encode_table,
    encoder_and_poolings,
    fit_cell,
    is_identity,
    loaded_tasks,
    run_meta,
    seeds_of,
)
from .regimes import seen_counts
from .results import HARM_MARGIN, PerSetCell, PerSetResult, fit_size_label

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


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set of the per-set protocol: its ``name`` (``"STS12/MSRpar"``, ``"STS-B"``, ``"SICK-R"``:
    their test split), ``dataset`` (the task, the unit :mod:`bertflow.paper.lodo` leaves out), scored ``pairs`` and
    its own distinct ``sentences``, the fitting pool (for STS-B and SICK-R all splits)."""

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
    """The sentences ``eval_set``'s calibrator is fitted on at ``fit_size`` (``None``: all of them), or ``None`` when
    the set has ``fit_size`` sentences or fewer (it is not scored at that size). ``seed`` and the set's name fix one
    random permutation per set; a sample of n is its first n entries (nested across sizes), in the set's order."""
    pool = eval_set.sentences
    if fit_size is None:
        return list(pool)
    if len(pool) <= fit_size:
        return None
    rng = np.random.default_rng([seed, zlib.crc32(eval_set.name.encode("utf-8"))])
    chosen = np.sort(rng.permutation(len(pool))[:fit_size])
    return [pool[i] for i in chosen]


def _spearman(eval_set: EvalSet, embed: Callable[[list[str]], np.ndarray]) -> float:
    return evaluate_pairs(eval_set.name, {eval_set.name: eval_set.pairs}, embed).subsets[0].spearman


@dataclass
class _Plan:
    """What a run scores: the unweighted poolings (read from ``encoded``'s table) and the weighted ones (encoded per
    fitting sample), each asked-for pooling's unweighted base (``base_of``), the calibrators and the cells."""

    encoder: SentenceEncoder
    config: GridConfig
    encoded: Encoded
    plain: list[Pooling]
    weighted: list[Pooling]
    base_of: dict[str, Pooling]
    specs: list[str]
    flow_kwargs: dict[str, Any]
    cells: dict[tuple[str, str, int | None], PerSetCell] = field(default_factory=dict)

    def cell(self, pooling: Pooling, spec: str, fit_size: int | None) -> PerSetCell:
        """The cell of (pooling, calibrator, fit size), created on first use."""
        key = (pooling.key, spec, fit_size)
        if key not in self.cells:
            base = self.base_of.get(pooling.key, pooling).key
            self.cells[key] = PerSetCell(pooling.key, base, spec, fit_size, seeds_of(spec, self.config.seeds))
        return self.cells[key]

    def score_set(self, es: EvalSet, sample: list[str], size: int | None) -> None:
        """Fit every cell of ``size`` on ``sample`` and score ``es`` (a weighted pooling's encoding counts in the
        run's encoding seconds)."""
        local: dict[str, EmbeddingTable] = {}  # weighted poolings, counted on this sample: their own table
        if self.weighted:
            # The token statistics of a weighted pooling come from this fitting sample, as Embedder.fit does.
            t0 = time.perf_counter()
            self.encoder.token_statistics = self.encoder.count_tokens(sample)
            items = distinct([*es.eval_sentences(), *sample])
            own = embed_cached(self.encoder, items, self.weighted, cache=self.encoded.cache,
                               batch_size=self.config.batch_size)  # fmt: skip
            local.update(dict.fromkeys(own, EmbeddingTable(items, own)))
            self.encoded.seconds += time.perf_counter() - t0

        def lookup(key: str, items: list[str]) -> np.ndarray:
            return local.get(key, self.encoded.table).get(key, items)

        with limited_threads(blas_threads=self.config.fit_threads):
            for p in [*self.plain, *self.weighted]:
                if size is None or p.weighting.weighted:  # an unweighted raw row does not depend on the size
                    self._fit_and_score(self.cell(p, "none", size), es, sample, lookup)
                if p.key in self.base_of:  # a pooling that was asked for (not only a weighted one's base)
                    for spec in self.specs:
                        self._fit_and_score(self.cell(p, spec, size), es, sample, lookup)

    def _fit_and_score(
        self, cell: PerSetCell, es: EvalSet, sample: list[str], lookup: Callable[[str, list[str]], np.ndarray]
    ) -> None:
        """Fit ``cell``'s calibrator on ``sample`` (every seed) and record the set's Spearman; a failure fails the
        cell. An ``auto`` cell may score another pooling than its own, as ``Embedder.fit`` would."""
        if cell.error:
            return
        started = time.perf_counter()
        auto = self.encoded.auto.get(cell.pooling) if is_auto(cell.calibrator) else None
        try:
            values = []
            for seed in cell.seeds:
                if cell.calibrator == "none":
                    values.append(_spearman(es, lambda s: lookup(cell.pooling, s)))
                    continue
                rows = lambda k: lookup(k, sample)  # noqa: E731
                cal, key, choice = fit_cell(cell.calibrator, self.flow_kwargs, seed, rows, cell.pooling, auto)
                if choice:
                    cell.auto[es.name] = choice
                values.append(_spearman(es, lambda s, cal=cal, key=key: cal.transform(lookup(key, s))))
            cell.runs[es.name] = values
        except BertflowError as e:
            cell.error = f"{es.name}: {type(e).__name__}: {e}"
            cell.runs = {}
        cell.seconds += time.perf_counter() - started


def run_per_set(
    config: GridConfig,
    *,
    encoder: SentenceEncoder | None = None,
    tasks: Mapping[str, StsTask] | None = None,
    progress: Progress | None = None,
) -> PerSetResult:
    """Run the per-set protocol for every pooling x calibrator x fitting-set size of ``config`` (``regimes`` must be
    ``["per-set"]``). The raw encoder of every pooling's unweighted base is always scored (it is the baseline), and
    every weighted pooling's uncalibrated row at every size. ``encoder`` replaces ``config.model`` (its own pooling
    is ignored; its token statistics are set per fitting sample while a weighted pooling is encoded, then restored);
    ``tasks`` replace reading them from ``config.data_dir``. InputError for bad options before any encoding;
    DataNotFoundError for missing data.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    sizes = _checked_sizes(config)
    encoder, poolings = encoder_and_poolings(config, encoder)
    specs, flow_kwargs = checked_specs(config, encoder.dim)
    specs = [s for s in specs if not is_identity(s)]
    tasks, data_dir = loaded_tasks(config, tasks)
    sets = evaluation_sets(tasks)
    base_of = {p.key: Pooling.parse(p.base_spec(), encoder.num_layers) for p in poolings}
    plain = list({b.key: b for b in base_of.values()}.values())  # every unweighted pooling: one encoder pass
    everything = distinct(s for es in sets for s in es.sentences)
    auto_for = poolings if any(is_auto(s) for s in specs) else []
    encoded = encode_table(encoder, everything, plain, config.cache(), config.batch_size, auto_for=auto_for, say=say)
    weighted = [p for p in poolings if p.weighting.weighted]
    plan = _Plan(encoder, config, encoded, plain, weighted, base_of, specs, flow_kwargs)
    fits: dict[str, dict[str, dict[str, Any] | None]] = {es.name: {} for es in sets}
    own_stats = encoder.token_statistics
    try:
        for size in sizes:
            label = fit_size_label(size)
            for es in sets:
                sample = fitting_sample(es, size, config.sample_seed)
                fits[es.name][label] = None
                if sample is not None:
                    fits[es.name][label] = {"n_fit": len(sample), "seen": seen_counts(sample, es.eval_sentences())}
                    plan.score_set(es, sample, size)
                    say(f"fit {label}: {es.name} ({len(sample)} sentences) done")
    finally:
        encoder.token_statistics = own_stats
    cells = list(plan.cells.values())
    meta = run_meta(
        encoder, tasks, data_dir, encoded, cells, command=config.command, device=config.device, started=started,
        poolings=[p.key for p in poolings], calibrators=["none", *specs], regimes={PER_SET: PER_SET_TEXT},
        fit_sizes=[fit_size_label(s) for s in sizes], sample_seed=config.sample_seed, seeds=config.seeds,
        flow=config.flow_meta(specs), fit_threads=config.fit_threads, protocol=_PROTOCOL,
    )  # fmt: skip
    info = {es.name: {"dataset": es.dataset, "n_pairs": len(es.pairs), "n_sentences": len(es.sentences)} for es in sets}
    return PerSetResult(meta, info, fits, cells)


def _checked_sizes(config: GridConfig) -> list[int | None]:
    """The fit sizes of a run, ``None`` (all of a set's sentences) first, after the checks needing no encoder."""
    regimes = [r.strip().lower() for r in config.regimes]
    if regimes != [PER_SET]:
        raise InputError(f"the per-set protocol runs alone: give regimes [{PER_SET!r}], got {list(config.regimes)}")
    if config.seeds < 1:
        raise InputError(f"seeds must be at least 1, got {config.seeds}")
    for n in config.fit_sizes:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
            raise InputError(f"fit sizes must be whole numbers of at least 2 sentences, got {n!r}")
    return [None, *sorted({int(n) for n in config.fit_sizes})]
