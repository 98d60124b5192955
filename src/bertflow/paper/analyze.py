"""The BERT-flow paper's analyses on any encoder and calibrator (``bertflow analyze``).

On the STS-B test pairs:

* **Lexical vs semantic similarity** (the paper's Table 6): Spearman x 100 of the gold, the raw and the calibrated
  similarity against the *word-level* Levenshtein distance between the two sentences (lowercased word and
  punctuation tokens), on all pairs and on the pairs with edit distance <= 4; and each similarity against gold.
  The paper does not say whether its edit distance counts characters or words; we count words.
* **Anisotropy** of the embeddings of the distinct STS-B test sentences, before and after calibration: the mean
  pairwise cosine, the partition-function isotropy score (Mu & Viswanath 2018; Arora et al. 2016) and the
  eigenvalue spectrum.
* **Plots** (matplotlib, Agg backend; PNG at 200 dpi, optionally PDF or SVG too): eigenvalue spectra,
  pairwise-cosine histograms, predicted similarity against gold, similarity against edit distance with 95%
  confidence intervals and the number of pairs per distance; drawn by :mod:`bertflow.paper.plots`.

Other calibrators can be fitted the same way and shown beside the main one (``compare``, e.g. whitening beside the
flow), so one report holds the paper's comparison.

All geometric measures are taken on L2-normalised rows, because cosine similarity ignores norms and the raw and
calibrated spaces have different scales.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from ..calibrators import Calibrator, parse_calibrator
from ..encoding.encoder import SentenceEncoder
from ..errors import InputError
from ..evaluation.cache import EmbeddingCache, embed_cached, pooling_key
from ..evaluation.datasets import StsTask, load_nli_sentences, load_sts_task, resolve_data_dir
from ..evaluation.sts import cosine_scores
from ..linalg import unit_rows
from ..resources import limited_threads, machine_info
from .published import TABLE6, TABLE6_SOURCE
from .regimes import fitting_sets

__all__ = [
    "SMALL_EDIT_DISTANCE",
    "word_tokens",
    "levenshtein",
    "edit_distances",
    "mean_pairwise_cosine",
    "isotropy_score",
    "spectrum",
    "geometry",
    "spearman_x100",
    "lexical_table",
    "AnalysisResult",
    "VECTOR_FORMATS",
    "analyze_stsb",
]

logger = logging.getLogger(__name__)

#: The paper's "small edit distance" cut-off: pairs whose word-level Levenshtein distance is at most this.
SMALL_EDIT_DISTANCE = 4

_TOKEN = re.compile(r"\w+|[^\w\s]")


def word_tokens(sentence: str) -> list[str]:
    """Lowercased word and punctuation tokens (``\\w+`` runs and single other non-space characters)."""
    return _TOKEN.findall(sentence.lower())


def levenshtein(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two token sequences (insertions, deletions, substitutions cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def edit_distances(sentences1: Sequence[str], sentences2: Sequence[str]) -> np.ndarray:
    """Word-level Levenshtein distance of each pair: int64 [N]."""
    return np.array(
        [levenshtein(word_tokens(a), word_tokens(b)) for a, b in zip(sentences1, sentences2, strict=True)],
        dtype=np.int64,
    )


def mean_pairwise_cosine(x: np.ndarray) -> float:
    """Mean cosine similarity over all pairs i != j of the rows of ``x`` [N, D] (exact, O(N D)).

    Uses sum_{i != j} u_i . u_j = ||sum_i u_i||^2 - N for unit rows u_i.
    """
    u = unit_rows(x)
    n = len(u)
    if n < 2:
        raise InputError("mean pairwise cosine needs at least 2 rows")
    total = float(np.square(u.sum(axis=0)).sum())
    return (total - float(np.square(u).sum())) / (n * (n - 1))


def isotropy_score(x: np.ndarray) -> float:
    """Partition-function isotropy I(X) = min_c Z(c) / max_c Z(c), Z(c) = sum_i exp(c . u_i) (Mu & Viswanath 2018).

    c ranges over the eigenvectors of U^T U and their negatives (an eigenvector has no sign); U holds the
    L2-normalised rows of ``x``. 1 means perfectly isotropic; values near 0 mean the vectors share a direction.
    Computed in log space, so it cannot overflow.

    Args:
        x: embeddings [N, D].

    Returns:
        The score in (0, 1].
    """
    u = unit_rows(x)
    _, vecs = np.linalg.eigh(u.T @ u)
    proj = u @ vecs  # [N, D]: c . u_i for every eigenvector c
    log_z = np.concatenate([logsumexp(proj, axis=0), logsumexp(-proj, axis=0)])
    return float(math.exp(log_z.min() - log_z.max()))


def spectrum(x: np.ndarray) -> np.ndarray:
    """Eigenvalues of U^T U / N for the L2-normalised rows U of ``x`` [N, D], descending; they sum to 1.

    The top eigenvalue is (about) the share of the common direction; a flat spectrum means isotropy.
    Returns float64 [min(N, D)].
    """
    u = unit_rows(x)
    sv = np.linalg.svd(u, compute_uv=False)
    return sv**2 / len(u)


def geometry(x: np.ndarray) -> dict[str, Any]:
    """Anisotropy measures of embeddings [N, D] (see the module docstring); JSON-ready."""
    eig = spectrum(x)
    p = eig / eig.sum()
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    return {
        "n": int(len(x)),
        "dim": int(x.shape[1]),
        "mean_pairwise_cosine": mean_pairwise_cosine(x),
        "isotropy_score": isotropy_score(x),
        "top_eigenvalue_share": float(p[0]),
        "top10_eigenvalue_share": float(p[:10].sum()),
        "effective_rank": math.exp(entropy),
        "eigenvalues": [float(v) for v in eig],
    }


def spearman_x100(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman correlation x 100 of ``a`` and ``b`` [N], or ``None`` when undefined (N < 3 or a constant input)."""
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(stats.spearmanr(a, b)[0]) * 100.0


def lexical_table(
    gold: np.ndarray, similarities: Mapping[str, np.ndarray], distance: np.ndarray, small: int = SMALL_EDIT_DISTANCE
) -> dict[str, Any]:
    """The paper's Table 6: Spearman x 100 of each similarity against edit distance and against gold.

    Args:
        gold: gold scores [N].
        similarities: e.g. ``{"raw": cos_raw, "calibrated": cos_cal}``, each [N].
        distance: edit distance of each pair [N].
        small: also report the pairs with ``distance <= small``.

    Returns:
        ``{"all": {"n": N, "rows": {name: {"vs_edit_distance", "vs_gold"}}}, "small": {...}}`` with ``"gold"``
        among the rows. A correlation that is undefined (constant input, too few pairs) is ``None``.
    """
    out: dict[str, Any] = {}
    for part, mask in (("all", np.ones(len(gold), dtype=bool)), ("small", distance <= small)):
        rows = {"gold": {"vs_edit_distance": spearman_x100(gold[mask], distance[mask]), "vs_gold": 100.0}}
        for name, sim in similarities.items():
            rows[name] = {
                "vs_edit_distance": spearman_x100(sim[mask], distance[mask]),
                "vs_gold": spearman_x100(sim[mask], gold[mask]),
            }
        out[part] = {"n": int(mask.sum()), "rows": rows}
    out["small"]["max_edit_distance"] = small
    return out


@dataclass
class AnalysisResult:
    """What ``bertflow analyze`` measured.

    Attributes:
        meta: model, calibrator, regime, data, machine, time, command.
        lexical: :func:`lexical_table` output.
        geometry: ``{"raw": geometry(...), "calibrated": geometry(...)}`` plus one entry per compared calibrator
            (keyed by its spec).
        plots: file names of the plots written (relative to the output folder), PNGs and any vector copies.
    """

    meta: dict[str, Any]
    lexical: dict[str, Any]
    geometry: dict[str, Any]
    plots: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of everything, the paper's Table 6 included for reference."""
        return {
            "meta": self.meta,
            "lexical": self.lexical,
            "geometry": self.geometry,
            "paper_table6": {"rows": TABLE6, "source": TABLE6_SOURCE},
            "plots": self.plots,
        }

    def to_markdown(self) -> str:
        """The report: settings, the Table 6 analogue beside the paper's, anisotropy before/after, plots."""
        m = self.meta

        def f(v: float | None, digits: int = 2) -> str:
            return "n/a" if v is None else f"{v:.{digits}f}"

        lines = [f"# bertflow analyze: `{m['model']['id']}` + `{m['calibrator']}`", ""]
        if m.get("command"):
            lines += ["Command:", "", "```bash", m["command"], "```", ""]
        mach = m["machine"]
        lines += [
            "| setting | value |",
            "|---|---|",
            f"| model | `{m['model']['id']}` (fingerprint {m['model']['fingerprint']}, {m['model']['dim']} dims), "
            f"pooling `{m['pooling']}`, max_length {m['model']['max_length']} |",
            f'| calibrator | `{m["calibrator"]}` ("calibrated" below)'
            + (f"; compared: {', '.join(f'`{c}`' for c in m['compare'])}" if m.get("compare") else "")
            + " |",
            f"| regime | {m['regime']}: {m['regime_text']} |",
            f"| test sentences seen by the fit | {m['test_seen']} |",
            f"| pairs | STS-B test, {self.lexical['all']['n']} pairs; {self.geometry['raw']['n']} distinct sentences "
            "for the geometry |",
            "| edit distance | word-level Levenshtein over lowercased word and punctuation tokens |",
            f"| machine | {mach['platform']}; {mach['cpu']}; {mach['usable_cpus']} usable CPUs; torch {mach['torch']}; "
            f"device {mach['device']} |",
            f"| wall time | {m['seconds']:.0f} s |",
            "",
            "## Similarity vs edit distance (the paper's Table 6)",
            "",
            "Spearman × 100. A similarity that tracks meaning should correlate with edit distance about as weakly as "
            "gold does; a strongly negative value means it mostly measures word overlap.",
            "",
            f"| similarity | vs edit distance | vs gold | vs edit distance, pairs with ED <= "
            f"{self.lexical['small']['max_edit_distance']} (n={self.lexical['small']['n']}) | vs gold, same pairs | "
            "paper (BERT-base): vs ED | paper: vs gold |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in self.lexical["all"]["rows"]:
            a, s = self.lexical["all"]["rows"][name], self.lexical["small"]["rows"][name]
            p = TABLE6.get(name, {})
            lines.append(
                f"| {name} | {f(a['vs_edit_distance'])} | {f(a['vs_gold'])} | {f(s['vs_edit_distance'])} | "
                f"{f(s['vs_gold'])} | {f(p.get('vs_edit_distance'))} | {f(p.get('vs_gold'))} |"
            )
        lines += [
            "",
            f"Paper: {TABLE6_SOURCE}. Its model is raw BERT-base, so compare the direction of the effect, not values.",
            "",
            "## Anisotropy (L2-normalised rows)",
            "",
            "| measure | " + " | ".join(self.geometry) + " | isotropic ideal |",
            "|---|" + "---:|" * (len(self.geometry) + 1),
        ]
        for key, label, ideal, digits in (
            ("mean_pairwise_cosine", "mean pairwise cosine", "0", 4),
            ("isotropy_score", "isotropy score min Z(c) / max Z(c)", "1", 4),
            ("top_eigenvalue_share", "top eigenvalue share of U^T U", "1/D", 4),
            ("top10_eigenvalue_share", "top-10 eigenvalue share", "10/D", 4),
            ("effective_rank", "effective rank (exp entropy of the spectrum)", "D", 1),
        ):
            values = " | ".join(f"{g[key]:.{digits}f}" for g in self.geometry.values())
            lines.append(f"| {label} | {values} | {ideal} |")
        dims = ", ".join(f"{name} {g['dim']}" for name, g in self.geometry.items())
        lines += ["", f"Dimensions: {dims}.", ""]
        if self.plots:
            lines += ["## Plots", ""]
            lines += [f"![{p}]({p})" for p in self.plots if p.endswith(".png")]
            vector = [p for p in self.plots if not p.endswith(".png")]
            if vector:
                lines += ["", "Vector copies: " + ", ".join(f"[{p}]({p})" for p in vector) + "."]
        return "\n".join(lines).rstrip() + "\n"


#: Plot formats ``analyze`` can write besides the PNG.
VECTOR_FORMATS = ("pdf", "svg")


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
    """Run the paper's analyses on STS-B test for an encoder and a calibrator.

    Args:
        encoder: the frozen encoder.
        pooling: pooling to analyse; ``None`` uses the encoder's own.
        calibrator: a spec fitted here under ``regime``, or an already-fitted calibrator (``regime`` is then
            only a label, e.g. from a saved model).
        regime: ``"target"`` (STS-B train + dev + test sentences), ``"train"``, ``"nli"`` or ``"corpus"``.
        data_dir: STS data folder; ``task`` replaces reading STS-B from it.
        nli, corpus, corpus_name: sentences of the ``nli`` / ``corpus`` regimes.
        seed: flow seed.
        flow_epochs: flow training epochs.
        device: device of the flow.
        cache: embedding cache (``None``: nothing stored).
        batch_size: sentences per encoder forward pass.
        out_dir: where to write ``analyze.json``, ``analyze.md`` and the PNGs (``None``: nothing written).
        plots: draw the plots (needs matplotlib).
        vector: vector formats written beside each PNG (:data:`VECTOR_FORMATS`: ``"pdf"``, ``"svg"``).
        compare: more calibrator specs, fitted on the same sentences (flows with the same seed) and shown beside the
            main one in every table and plot (e.g. ``["whitening"]`` beside the flow).
        command: the command line, for the report.
        progress: called with one line per step.

    Returns:
        The measurements.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    compare = _checked_compare(calibrator, vector, compare)
    pool = pooling_key(pooling if pooling is not None else encoder.pooling.to_spec(), encoder.num_layers)
    if task is None:
        task = load_sts_task("STS-B", resolve_data_dir(data_dir))
    test = task.eval_subsets["test"] if "test" in task.eval_subsets else next(iter(task.eval_subsets.values()))
    if test.scores is None:
        raise InputError("STS-B test pairs have no gold scores")
    eval_sentences = task.eval_sentences()
    if isinstance(calibrator, Calibrator):
        fit_sentences: list[str] = []
        regime_text = "calibrator fitted beforehand (saved model)"
        seen = "unknown (the calibrator was fitted outside this command)"
    else:
        if regime == "nli" and nli is None:
            nli = load_nli_sentences(data_dir)
        fit_sentences, regime_text, seen = _fitting_plan(task, regime, nli, corpus, corpus_name)
    rows = _row_lookup(encoder, [*eval_sentences, *fit_sentences], pool, cache, batch_size, say)
    fit = dict(seed=seed, epochs=flow_epochs, device=device)
    with limited_threads(blas_threads=1):  # small matrices; see GridConfig.fit_threads
        spec, spaces = _fitted_spaces(calibrator, compare, rows, fit_sentences, eval_sentences, fit, regime, say)
        geo = {name: geometry(x) for name, x in spaces.items()}
    ev_index = {s: i for i, s in enumerate(eval_sentences)}
    i1 = np.fromiter((ev_index[s] for s in test.sentences1), dtype=np.int64, count=len(test))
    i2 = np.fromiter((ev_index[s] for s in test.sentences2), dtype=np.int64, count=len(test))
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
    if out_dir is not None:
        title = f"{Path(encoder.model_id).name}, {pool} pooling, {regime} regime"
        plotted = (spaces, cosines, test.scores, distance, title, seed, vector) if plots else None
        _write_analysis(result, Path(out_dir), spec, plotted, started)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _write_analysis(
    result: AnalysisResult, out: Path, spec: str, plotted: tuple[Any, ...] | None, started: float
) -> None:
    """Draw the plots (``plotted``: :func:`~bertflow.paper.plots.plot_analysis`'s arguments after the folder, with
    the spaces and cosines keyed ``raw`` / ``calibrated`` / compared specs; ``None``: no plots), then write
    ``analyze.json`` and ``analyze.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if plotted is not None:
        from .plots import plot_analysis  # here, not at the top: plots imports this module's measures

        spaces, cosines, *rest = plotted
        label = {"calibrated": spec} if spec not in spaces else {}  # legends name the calibrator
        named = {label.get(k, k): v for k, v in spaces.items()}
        result.plots = plot_analysis(out, named, {label.get(k, k): v for k, v in cosines.items()}, *rest)
    result.meta["seconds"] = round(time.perf_counter() - started, 1)
    (out / "analyze.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    (out / "analyze.md").write_text(result.to_markdown(), encoding="utf-8")


def _row_lookup(
    encoder: SentenceEncoder,
    sentences: Sequence[str],
    pool: str,
    cache: EmbeddingCache | None,
    batch_size: int | None,
    say: Callable[[str], None],
) -> Callable[[Sequence[str]], np.ndarray]:
    """Encode the distinct ``sentences`` once (through the cache) and return ``rows(items)``: their embeddings [N, D]
    under ``pool``."""
    distinct = list(dict.fromkeys(sentences))
    say(f"encoding {len(distinct)} distinct sentences with {encoder.model_id} ({pool})")
    emb = embed_cached(encoder, distinct, [pool], cache=cache, batch_size=batch_size)[pool]
    index = {s: i for i, s in enumerate(distinct)}

    def rows(items: Sequence[str]) -> np.ndarray:
        return emb[np.fromiter((index[s] for s in items), dtype=np.int64, count=len(items))]

    return rows


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
    task: StsTask, regime: str, nli: Sequence[str] | None, corpus: Sequence[str] | None, corpus_name: str | None
) -> tuple[list[str], str, str]:
    """The sentences a calibrator is fitted on under ``regime``, the regime's description and how many of the
    task's evaluation sentences they contain."""
    fits = fitting_sets(regime, {task.name: task}, nli=nli, corpus=corpus, corpus_name=corpus_name)
    fit_sentences = fits.per_task[task.name] or []
    if not fit_sentences:
        raise InputError(f"the {regime} regime has no fitting sentences for {task.name}")
    eval_sentences = task.eval_sentences()
    fit_set = set(fit_sentences)
    k = sum(1 for s in eval_sentences if s in fit_set)
    seen = f"{k} of {len(eval_sentences)}" + (" (transductive)" if k == len(eval_sentences) else "")
    return fit_sentences, fits.description, seen


def _fitted_spaces(
    calibrator: str | Calibrator,
    compare: Sequence[str],
    rows: Callable[[Sequence[str]], np.ndarray],
    fit_sentences: list[str],
    eval_sentences: list[str],
    fit: Mapping[str, Any],
    regime: str,
    say: Callable[[str], None],
) -> tuple[str, dict[str, np.ndarray]]:
    """The calibrator's name and the evaluation sentences' embeddings in every space: ``raw``, ``calibrated`` and
    each ``compare`` spec (fitted here on ``fit_sentences`` with the keyword arguments ``fit``)."""
    if isinstance(calibrator, Calibrator):
        cal, spec = calibrator, getattr(calibrator, "name", type(calibrator).__name__)
    else:
        spec = str(calibrator)
        cal = parse_calibrator(spec, **fit)
        say(f"fitting {spec} on {len(fit_sentences)} sentences ({regime})")
        cal.fit(rows(fit_sentences))
    raw_eval = rows(eval_sentences)
    spaces = {"raw": raw_eval, "calibrated": cal.transform(raw_eval)}
    for other in compare:
        say(f"fitting {other} on {len(fit_sentences)} sentences ({regime})")
        spaces[other] = parse_calibrator(other, **fit).fit(rows(fit_sentences)).transform(raw_eval)
    return spec, spaces
