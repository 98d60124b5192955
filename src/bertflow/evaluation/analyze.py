"""The BERT-flow paper's analyses on any encoder and calibrator (``bertflow analyze``).

On the STS-B test pairs:

* **Lexical vs semantic similarity** (the paper's Table 6): Spearman x 100 of the gold, the raw and the calibrated
  similarity against the *word-level* Levenshtein distance between the two sentences (lowercased word and
  punctuation tokens), on all pairs and on the pairs with edit distance <= 4; and each similarity against gold.
  The paper does not say whether its edit distance counts characters or words; we count words.
* **Anisotropy** of the embeddings of the distinct STS-B test sentences, before and after calibration: the mean
  pairwise cosine, the partition-function isotropy score (Mu & Viswanath 2018; Arora et al. 2016) and the
  eigenvalue spectrum.
* **Plots** (matplotlib, Agg backend): singular-value spectra, pairwise-cosine histograms, predicted similarity
  against gold, similarity against edit distance.

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
from ..data import StsTask, load_nli_sentences, load_sts_task, resolve_data_dir
from ..encoder import SentenceEncoder
from ..errors import InputError
from ..linalg import unit_rows
from .cache import EmbeddingCache, embed_cached, pooling_key
from .paper import TABLE6, TABLE6_SOURCE
from .reproduce import _blas_threads, fitting_sets, machine_info
from .sts import cosine_scores

__all__ = [
    "SMALL_EDIT_DISTANCE",
    "word_tokens",
    "levenshtein",
    "edit_distances",
    "mean_pairwise_cosine",
    "isotropy_score",
    "spectrum",
    "geometry",
    "lexical_table",
    "AnalysisResult",
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


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
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
        rows = {"gold": {"vs_edit_distance": _spearman(gold[mask], distance[mask]), "vs_gold": 100.0}}
        for name, sim in similarities.items():
            rows[name] = {
                "vs_edit_distance": _spearman(sim[mask], distance[mask]),
                "vs_gold": _spearman(sim[mask], gold[mask]),
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
        geometry: ``{"raw": geometry(...), "calibrated": geometry(...)}``.
        plots: file names of the PNGs written (relative to the output folder).
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
            f"| calibrator | `{m['calibrator']}` |",
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
            "| measure | raw | calibrated | isotropic ideal |",
            "|---|---:|---:|---:|",
        ]
        raw, cal = self.geometry["raw"], self.geometry["calibrated"]
        for key, label, ideal, digits in (
            ("mean_pairwise_cosine", "mean pairwise cosine", "0", 4),
            ("isotropy_score", "isotropy score min Z(c) / max Z(c)", "1", 4),
            ("top_eigenvalue_share", "top eigenvalue share of U^T U", "1/D", 4),
            ("top10_eigenvalue_share", "top-10 eigenvalue share", "10/D", 4),
            ("effective_rank", "effective rank (exp entropy of the spectrum)", "D", 1),
        ):
            lines.append(f"| {label} | {raw[key]:.{digits}f} | {cal[key]:.{digits}f} | {ideal} |")
        lines += ["", f"Dimensions: raw {raw['dim']}, calibrated {cal['dim']}.", ""]
        if self.plots:
            lines += ["## Plots", ""]
            lines += [f"![{p}]({p})" for p in self.plots]
        return "\n".join(lines).rstrip() + "\n"


def _plot(
    out_dir: Path,
    raw: np.ndarray,
    cal: np.ndarray,
    cos_raw: np.ndarray,
    cos_cal: np.ndarray,
    gold: np.ndarray,
    distance: np.ndarray,
    title: str,
    seed: int = 0,
) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'bertflow[plots]' (or pass --no-plots)") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    names: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        names.append(name)

    # Singular-value spectra of the normalised rows.
    fig, ax = plt.subplots(figsize=(6, 4))
    for x, label in ((raw, "raw"), (cal, "calibrated")):
        sv = np.sqrt(spectrum(x))
        # (Near-)constant dimensions give singular values ~1e-9 and below that would squash the plot's scale.
        keep = sv > 1e-6 * sv[0]
        dropped = f", {int((~keep).sum())} near-zero omitted" if (~keep).any() else ""
        ax.semilogy(np.flatnonzero(keep), sv[keep], label=f"{label}{dropped}")
    ax.set(xlabel="index", ylabel="singular value of U / sqrt(N)", title=f"Spectrum: {title}")
    ax.legend()
    save(fig, "spectrum.png")
    # Pairwise cosine histograms on a random sample of pairs i != j.
    rng = np.random.default_rng(seed)
    n = len(raw)
    i = rng.integers(0, n, size=min(200_000, n * (n - 1)))
    j = (i + rng.integers(1, n, size=len(i))) % n
    fig, ax = plt.subplots(figsize=(6, 4))
    for x, label in ((raw, "raw"), (cal, "calibrated")):
        u = unit_rows(x)
        c = (u[i] * u[j]).sum(axis=1)
        ax.hist(c, bins=100, range=(-1, 1), alpha=0.55, density=True, label=f"{label} (mean {c.mean():.3f})")
    ax.set(xlabel="cosine similarity of random sentence pairs", ylabel="density", title=f"Pairwise cosine: {title}")
    ax.legend()
    save(fig, "cosine_hist.png")
    # Predicted similarity vs gold.
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, sim, label in ((axes[0], cos_raw, "raw"), (axes[1], cos_cal, "calibrated")):
        rho = stats.spearmanr(sim, gold)[0] * 100
        ax.scatter(gold, sim, s=4, alpha=0.4)
        ax.set(xlabel="gold score", ylabel="cosine similarity", title=f"{label}: Spearman {rho:.2f}")
    fig.suptitle(f"STS-B test: {title}")
    save(fig, "similarity_vs_gold.png")
    # Similarity vs edit distance: mean per distance, gold rescaled to [0, 1].
    fig, ax = plt.subplots(figsize=(6, 4))
    top = int(min(distance.max(), 30))
    ds = np.arange(top + 1)
    for sim, label in ((gold / 5.0, "gold / 5"), (cos_raw, "raw cosine"), (cos_cal, "calibrated cosine")):
        means = [sim[distance == d].mean() if (distance == d).any() else np.nan for d in ds]
        ax.plot(ds, means, marker="o", ms=3, label=label)
    ax.axvline(SMALL_EDIT_DISTANCE + 0.5, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="word-level edit distance", ylabel="mean similarity", title=f"Similarity vs edit distance: {title}")
    ax.legend()
    save(fig, "similarity_vs_edit_distance.png")
    return names


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
        plots: draw the PNGs (needs matplotlib).
        command: the command line, for the report.
        progress: called with one line per step.

    Returns:
        The measurements.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    pool = pooling_key(pooling if pooling is not None else encoder.pooling.to_spec(), encoder.num_layers)
    if task is None:
        task = load_sts_task("STS-B", resolve_data_dir(data_dir))
    test = task.eval_subsets["test"] if "test" in task.eval_subsets else next(iter(task.eval_subsets.values()))
    if test.scores is None:
        raise InputError("STS-B test pairs have no gold scores")
    eval_sentences = task.eval_sentences()
    fitted = isinstance(calibrator, Calibrator)
    fit_sentences: list[str] = []
    regime_text = "calibrator fitted beforehand (saved model)"
    seen = "unknown (the calibrator was fitted outside this command)"
    if not fitted:
        if regime == "nli" and nli is None:
            nli = load_nli_sentences(data_dir)
        fits = fitting_sets(regime, {task.name: task}, nli=nli, corpus=corpus, corpus_name=corpus_name)
        fit_sentences = fits.per_task[task.name] or []
        if not fit_sentences:
            raise InputError(f"the {regime} regime has no fitting sentences for {task.name}")
        regime_text = fits.description
        fit_set = set(fit_sentences)
        k = sum(1 for s in eval_sentences if s in fit_set)
        seen = f"{k} of {len(eval_sentences)}" + (" (transductive)" if k == len(eval_sentences) else "")
    sentences = list(dict.fromkeys([*eval_sentences, *fit_sentences]))
    say(f"encoding {len(sentences)} distinct sentences with {encoder.model_id} ({pool})")
    emb = embed_cached(encoder, sentences, [pool], cache=cache, batch_size=batch_size)[pool]
    index = {s: i for i, s in enumerate(sentences)}

    def rows(items: Sequence[str]) -> np.ndarray:
        return emb[np.fromiter((index[s] for s in items), dtype=np.int64, count=len(items))]

    with _blas_threads(1):  # small matrices; see GridConfig.fit_threads
        if fitted:
            cal = calibrator
            spec = getattr(calibrator, "name", type(calibrator).__name__)
        else:
            spec = str(calibrator)
            cal = parse_calibrator(spec, seed=seed, epochs=flow_epochs, device=device)
            say(f"fitting {spec} on {len(fit_sentences)} sentences ({regime})")
            cal.fit(rows(fit_sentences))
        raw_eval = rows(eval_sentences)
        cal_eval = cal.transform(raw_eval)
        geo = {"raw": geometry(raw_eval), "calibrated": geometry(cal_eval)}
    ev_index = {s: i for i, s in enumerate(eval_sentences)}
    i1 = np.fromiter((ev_index[s] for s in test.sentences1), dtype=np.int64, count=len(test))
    i2 = np.fromiter((ev_index[s] for s in test.sentences2), dtype=np.int64, count=len(test))
    cos_raw = cosine_scores(raw_eval[i1], raw_eval[i2])
    cos_cal = cosine_scores(cal_eval[i1], cal_eval[i2])
    distance = edit_distances(test.sentences1, test.sentences2)
    lexical = lexical_table(test.scores, {"raw": cos_raw, "calibrated": cos_cal}, distance)
    meta: dict[str, Any] = {
        "command": command,
        "model": {
            "id": encoder.model_id,
            "fingerprint": encoder.fingerprint(),
            "dim": encoder.dim,
            "max_length": encoder.max_length,
        },
        "pooling": pool,
        "calibrator": spec,
        "seed": seed,
        "regime": regime,
        "regime_text": regime_text,
        "test_seen": seen,
        "edit_distance": "word-level Levenshtein over lowercased \\w+ / punctuation tokens",
        "geometry_on": "L2-normalised embeddings of the distinct STS-B test sentences",
        "machine": machine_info(device),
    }
    result = AnalysisResult(meta, lexical, geo)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if plots:
            title = f"{Path(encoder.model_id).name} {pool} + {spec}"
            result.plots = _plot(out, raw_eval, cal_eval, cos_raw, cos_cal, test.scores, distance, title, seed)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    if out_dir is not None:
        out = Path(out_dir)
        (out / "analyze.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
        (out / "analyze.md").write_text(result.to_markdown(), encoding="utf-8")
    return result
