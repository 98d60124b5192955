"""The BERT-flow paper's analyses on any encoder and calibrator (``bertflow analyze``), on the STS-B test pairs: the
paper's Table 6 (similarity against word-level edit distance and against gold), anisotropy before and after
calibration (:mod:`bertflow.paper.measures`) and plots (:mod:`bertflow.paper.plots`), with ``compare`` calibrators
fitted the same way beside the main one. The report's Markdown: :func:`bertflow.paper.render.render_analysis`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..calibrators import Calibrator, parse_calibrator
from ..encoding.encoder import SentenceEncoder
from ..errors import InputError
from ..evaluation.cache import EmbeddingCache, pooling_key
from ..evaluation.datasets import StsTask, load_nli_sentences, load_sts_task, resolve_data_dir
from ..evaluation.sts import cosine_scores
from ..io.text import distinct
from ..resources import limited_threads, machine_info
from .grid import encode_table
from .measures import edit_distances, geometry, lexical_table
from .plots import plot_analysis
from .published import TABLE6, TABLE6_SOURCE
from .regimes import fitting_sets, seen_counts
from .render import render_analysis, write_report

#: Plot formats ``analyze`` can write besides the PNG.
VECTOR_FORMATS = ("pdf", "svg")


@dataclass
class AnalysisResult:
    """What ``bertflow analyze`` measured: ``meta`` (model, calibrator, regime, data, machine, time, command),
    ``lexical`` (:func:`~bertflow.paper.measures.lexical_table`), ``geometry`` (``{"raw": geometry(...),
    "calibrated": geometry(...)}`` plus one entry per compared calibrator) and ``plots``, the file names written
    (relative to the output folder), PNGs and any vector copies."""

    meta: dict[str, Any]
    lexical: dict[str, Any]
    geometry: dict[str, Any]
    plots: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of everything, the paper's Table 6 included for reference."""
        return {**asdict(self), "paper_table6": {"rows": TABLE6, "source": TABLE6_SOURCE}}


def analyze_stsb(
    encoder: SentenceEncoder,
    *,
    pooling: str | None = None,
    calibrator: str | Calibrator = "flow",
    regime: str = "target",
    data_dir: str | Path | None = None,
    task: StsTask | None = None,
    nli: Sequence[str] | None = None,
    corpus: Sequence[str] | None = None,
    corpus_name: str | None = None,
    seed: int = 0,
    flow_epochs: float = 1.0,
    device: str | None = None,
    cache: EmbeddingCache | None = None,
    batch_size: int | None = None,
    out_dir: str | Path | None = None,
    plots: bool = True,
    vector: Sequence[str] = (),
    compare: Sequence[str] = (),
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Run the paper's analyses on STS-B test; write ``analyze.json``, ``analyze.md`` and the plots into ``out_dir``
    (``None``: nothing written).

    ``pooling``: ``None`` analyses the encoder's own; ``calibrator``: a spec fitted here under ``regime``, or one
    already fitted (``regime`` is then a label); ``data_dir`` or ``task`` (STS-B already loaded), and ``nli``,
    ``corpus``, ``corpus_name`` for those regimes; ``vector``: plot formats besides PNG (:data:`VECTOR_FORMATS`);
    ``compare``: more calibrator specs fitted on the same sentences (flows with the same seed), shown beside the main
    one in every table and plot.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    compare = _checked_compare(calibrator, vector, compare)
    pool = pooling_key(pooling if pooling is not None else encoder.pooling.to_spec(), encoder.num_layers)
    task = task or load_sts_task("STS-B", resolve_data_dir(data_dir))
    test = task.eval_subsets["test"] if "test" in task.eval_subsets else next(iter(task.eval_subsets.values()))
    if test.scores is None:
        raise InputError("STS-B test pairs have no gold scores")
    eval_sentences = task.eval_sentences()
    fit_sentences, regime_text, seen = _fitting_plan(calibrator, task, regime, data_dir, nli, corpus, corpus_name)
    encoded = encode_table(encoder, distinct([*eval_sentences, *fit_sentences]), [pool], cache, batch_size, say=say)
    rows = partial(encoded.table.get, pool)

    def fitted(spec: str) -> Calibrator:
        say(f"fitting {spec} on {len(fit_sentences)} sentences ({regime})")
        return parse_calibrator(spec, seed=seed, epochs=flow_epochs, device=device).fit(rows(fit_sentences))

    with limited_threads(blas_threads=1):  # small matrices; see GridConfig.fit_threads
        spec, spaces = _fitted_spaces(calibrator, compare, fitted, rows(eval_sentences))
        geo = {name: geometry(x) for name, x in spaces.items()}
    position = {s: i for i, s in enumerate(eval_sentences)}
    i1, i2 = ([position[s] for s in side] for side in (test.sentences1, test.sentences2))
    cosines = {name: cosine_scores(x[i1], x[i2]) for name, x in spaces.items()}
    distance = edit_distances(test.sentences1, test.sentences2)
    meta: dict[str, Any] = {
        "command": command,
        "model": {"id": encoder.model_id, "fingerprint": encoder.fingerprint(), "dim": encoder.dim,
                  "max_length": encoder.max_length},
        "pooling": pool, "calibrator": spec, "compare": compare, "seed": seed,
        "regime": regime, "regime_text": regime_text, "test_seen": seen,
        "edit_distance": "word-level Levenshtein over lowercased \\w+ / punctuation tokens",
        "geometry_on": "L2-normalised embeddings of the distinct STS-B test sentences",
        "machine": machine_info(device),
    }  # fmt: skip
    result = AnalysisResult(meta, lexical_table(test.scores, cosines, distance), geo)
    if out_dir is not None and plots:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        named = {"calibrated": spec} if spec not in spaces else {}  # legends name the calibrator
        title = f"{Path(encoder.model_id).name}, {pool} pooling, {regime} regime"
        result.plots = plot_analysis(Path(out_dir), {named.get(k, k): v for k, v in spaces.items()},
                                     {named.get(k, k): v for k, v in cosines.items()},
                                     test.scores, distance, title, seed, vector)  # fmt: skip
    meta["seconds"] = round(time.perf_counter() - started, 1)
    if out_dir is not None:
        write_report(Path(out_dir), "analyze", render_analysis(result), result.to_dict())
    return result


def _checked_compare(calibrator: str | Calibrator, vector: Sequence[str], compare: Sequence[str]) -> list[str]:
    """The distinct ``compare`` specs, after every check of the options that needs no encoding."""
    for fmt in vector:
        if fmt not in VECTOR_FORMATS:
            raise InputError(f"unknown plot format {fmt!r}; use one of {', '.join(VECTOR_FORMATS)}")
    specs = list(dict.fromkeys(compare))
    for spec in specs:
        parse_calibrator(spec)  # unknown specs fail before encoding
        if spec in ("raw", "calibrated"):
            raise InputError(f"{spec!r} cannot be compared: it names a column of the report")
    if specs and isinstance(calibrator, Calibrator):
        raise InputError("compare needs the calibrator as a spec fitted here, not an already-fitted one")
    return specs


def _fitting_plan(
    calibrator: str | Calibrator,
    task: StsTask,
    regime: str,
    data_dir: str | Path | None,
    nli: Sequence[str] | None,
    corpus: Sequence[str] | None,
    corpus_name: str | None,
) -> tuple[list[str], str, str]:
    """The sentences the calibrator is fitted on under ``regime`` (none for an already-fitted one), the regime's
    description and how many of the task's evaluation sentences they contain."""
    if isinstance(calibrator, Calibrator):
        unknown = "unknown (the calibrator was fitted outside this command)"
        return [], "calibrator fitted beforehand (saved model)", unknown
    if regime == "nli" and nli is None:
        nli = load_nli_sentences(data_dir)
    fits = fitting_sets(regime, {task.name: task}, nli=nli, corpus=corpus, corpus_name=corpus_name)
    fit_sentences = fits.per_task[task.name] or []
    if not fit_sentences:
        raise InputError(f"the {regime} regime has no fitting sentences for {task.name}")
    counts = seen_counts(fit_sentences, task.eval_sentences())
    k, n = counts["seen"], counts["of"]  # type: ignore[index]
    return fit_sentences, fits.description, f"{k} of {n}" + (" (transductive)" if k == n else "")


def _fitted_spaces(
    calibrator: str | Calibrator,
    compare: Sequence[str],
    fitted: Callable[[str], Calibrator],
    raw_eval: np.ndarray,
) -> tuple[str, dict[str, np.ndarray]]:
    """The calibrator's name and the evaluation sentences' embeddings (``raw_eval``) in every space: ``raw``,
    ``calibrated`` and each ``compare`` spec (``fitted(spec)`` fits one on the fitting sentences)."""
    if isinstance(calibrator, Calibrator):
        cal, spec = calibrator, getattr(calibrator, "name", type(calibrator).__name__)
    else:
        spec = str(calibrator)
        cal = fitted(spec)
    spaces = {"raw": raw_eval, "calibrated": cal.transform(raw_eval)}
    spaces.update({other: fitted(other).transform(raw_eval) for other in compare})
    return spec, spaces
