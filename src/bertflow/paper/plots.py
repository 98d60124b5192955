"""The figures of ``bertflow analyze`` (matplotlib, Agg backend; PNG at 200 dpi, optionally PDF or SVG too):
eigenvalue spectra, pairwise-cosine histograms, similarity against gold and against edit distance. matplotlib is an
optional extra (``bertflow[plots]``), imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ..errors import InputError
from ..linalg import unit_rows
from .measures import SMALL_EDIT_DISTANCE, isotropy_score, spearman_x100, spectrum

#: Edit distances above this are pooled into one bin in the edit-distance plot (few pairs lie beyond it).
MAX_DISTANCE_BIN = 20


def require_matplotlib() -> None:
    """Raise :class:`InputError` (what to install, or ``--no-plots``) unless matplotlib can be imported: checked
    by ``bertflow analyze`` before any encoding or fitting, and again before drawing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("plots need matplotlib: pip install 'bertflow[plots]' (or pass --no-plots)")


def plot_analysis(
    out_dir: Path,
    embeddings: Mapping[str, np.ndarray],
    similarities: Mapping[str, np.ndarray],
    gold: np.ndarray,
    distance: np.ndarray,
    title: str,
    seed: int = 0,
    vector: Sequence[str] = (),
) -> list[str]:
    """Draw the four figures from ``embeddings`` (``{name: [N, D]}`` of the distinct test sentences, raw first),
    ``similarities`` (``{name: [P]}`` cosine per test pair), ``gold`` [P] (0-5) and word-level edit ``distance`` [P];
    returns the file names written (PNG at 200 dpi, plus each ``vector`` format)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    names: list[str] = []
    colours = dict(zip(embeddings, plt.rcParams["axes.prop_cycle"].by_key()["color"][1:], strict=False))
    style = {"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "axes.spines.top": False,
             "axes.spines.right": False}  # fmt: skip

    def save(fig: Any, stem: str) -> None:
        fig.tight_layout()
        for ext in ("png", *vector):
            fig.savefig(out_dir / f"{stem}.{ext}", dpi=200)
            names.append(f"{stem}.{ext}")
        plt.close(fig)

    with plt.rc_context(style):
        save(_spectrum_figure(plt, embeddings, colours, title), "spectrum")
        save(_cosine_figure(plt, embeddings, colours, title, seed), "cosine_hist")
        save(_gold_figure(plt, similarities, gold, colours, title), "similarity_vs_gold")
        save(_edit_distance_figure(plt, similarities, gold, distance, colours, title), "similarity_vs_edit_distance")
    return names


def _spectrum_figure(plt: Any, embeddings: Mapping[str, np.ndarray], colours: Mapping[str, str], title: str) -> Any:
    """The eigenvalue spectrum of each space's normalised rows: how evenly the second moment spreads."""
    fig, ax = plt.subplots(figsize=(6.2, 3.9))
    dim = 1
    for name, x in embeddings.items():
        share = spectrum(x)
        share = share / share.sum()
        dim = max(dim, x.shape[1])
        # (Near-)constant dimensions give shares ~1e-18 that would squash the log scale.
        keep = share > 1e-12 * share[0]
        dropped = f", {int((~keep).sum())} near-zero omitted" if (~keep).any() else ""
        label = f"{name} (top {100 * share[0]:.1f}%, isotropy {isotropy_score(x):.2g}{dropped})"
        ax.semilogy(np.flatnonzero(keep) + 1, share[keep], color=colours.get(name), lw=1.4, label=label)
    ax.axhline(1 / dim, color="grey", lw=0.8, ls="--", label=f"isotropic: 1/D = 1/{dim}")
    ax.set(xlabel="principal direction (rank by eigenvalue)", ylabel="share of the second moment (log)",
           title=f"Eigenvalue spectrum, {len(next(iter(embeddings.values())))} sentences\n{title}")  # fmt: skip
    ax.legend(frameon=False)
    return fig


def _cosine_figure(
    plt: Any, embeddings: Mapping[str, np.ndarray], colours: Mapping[str, str], title: str, seed: int
) -> Any:
    """Histograms of the cosine of random pairs i != j of distinct sentences, one per space."""
    rng = np.random.default_rng(seed)
    n = len(next(iter(embeddings.values())))
    i = rng.integers(0, n, size=min(200_000, n * (n - 1)))
    j = (i + rng.integers(1, n, size=len(i))) % n
    fig, ax = plt.subplots(figsize=(6.2, 3.9))
    for name, x in embeddings.items():
        u = unit_rows(x)
        c = (u[i] * u[j]).sum(axis=1)
        colour = colours.get(name)
        label = f"{name} (mean {c.mean():.3f})"
        ax.hist(c, bins=100, range=(-1, 1), density=True, histtype="stepfilled", alpha=0.35, color=colour,
                edgecolor=colour, label=label)  # fmt: skip
    ax.axvline(0, color="grey", lw=0.8, ls="--", label="cosine 0 (orthogonal)")
    ax.set(xlabel="cosine similarity", ylabel="density (1 / unit cosine)",
           title=f"Cosine of {len(i):,} random pairs of distinct test sentences\n{title}")  # fmt: skip
    ax.legend(frameon=False)
    return fig


def _gold_figure(
    plt: Any, similarities: Mapping[str, np.ndarray], gold: np.ndarray, colours: Mapping[str, str], title: str
) -> Any:
    """Predicted similarity vs gold, one panel per similarity."""
    k = len(similarities)
    fig, axes = plt.subplots(1, k, figsize=(3.3 * k, 3.3), squeeze=False)
    for ax, (name, sim) in zip(axes[0], similarities.items(), strict=True):
        rho = stats.spearmanr(sim, gold)[0] * 100
        ax.scatter(gold, sim, s=3, alpha=0.3, color=colours.get(name), rasterized=True)
        ax.set(xlabel="gold similarity (0-5)", ylabel="cosine similarity",
               title=f"{name}: Spearman {rho:.2f} (n={len(gold)})")  # fmt: skip
    fig.suptitle(f"STS-B test: {title}", fontsize=10)
    return fig


def _edit_distance_figure(
    plt: Any,
    similarities: Mapping[str, np.ndarray],
    gold: np.ndarray,
    distance: np.ndarray,
    colours: Mapping[str, str],
    title: str,
) -> Any:
    """Similarity vs word edit distance, with the pair counts per distance. Each similarity is standardised over the
    pairs (z-score), so raw cosines (all near 1) and calibrated ones share an axis; mean and 95% CI (normal
    approximation) per distance."""
    bins = np.minimum(distance, MAX_DISTANCE_BIN)
    ds = np.arange(int(bins.max()) + 1)
    counts = np.array([(bins == d).sum() for d in ds])
    fig, (ax, bar) = plt.subplots(2, 1, figsize=(6.2, 4.9), sharex=True, height_ratios=(3, 1))
    series = {"gold": gold, **similarities}
    for offset, (name, sim) in zip(np.linspace(-0.2, 0.2, len(series)), series.items(), strict=True):
        z = (sim - sim.mean()) / (sim.std() or 1.0)
        groups = [z[bins == d] for d in ds]
        mean = np.array([g.mean() if len(g) else np.nan for g in groups])
        half = np.array([1.96 * g.std(ddof=1) / math.sqrt(len(g)) if len(g) > 1 else np.nan for g in groups])
        rho = spearman_x100(sim, distance.astype(np.float64))
        colour = "black" if name == "gold" else colours.get(name)
        ax.errorbar(ds + offset, mean, yerr=half, marker="o", ms=2.5, lw=1, capsize=1.5, color=colour,
                    label=f"{name} (Spearman vs ED {rho:.1f})" if rho is not None else name)  # fmt: skip
    ax.axvline(SMALL_EDIT_DISTANCE + 0.5, color="grey", lw=0.8, ls="--",
               label=f"paper's small-distance cut (ED <= {SMALL_EDIT_DISTANCE})")  # fmt: skip
    ax.set(ylabel="similarity, z-score over pairs", title=f"Similarity vs word edit distance, STS-B test\n{title}")
    ax.legend(frameon=False)
    bar.bar(ds, counts, color="grey", width=0.8)
    bar.set(xlabel=f"word-level edit distance (last bin: >= {MAX_DISTANCE_BIN})", ylabel="pairs")
    return fig
