"""Beyond the paper (issue 8): raw vs flow vs whitening vs anchored whitening, plus the ablation behind it.

Protocol (also written into the report):

- Encoder: the embedded default (all-MiniLM-L6-v2) or ``--model``, max_length 64, float32 on CPU; embeddings
  read from the shared embedding cache (:func:`bertflow.evaluation.cache.embed_cached`), encoding only what it
  lacks, every pooling in one pass.
- Tasks: STS12-16, STS-B test, SICK-R test; Spearman x100 of cosine; "all" (subsets concatenated) and "wmean"
  (subset-size-weighted mean); Avg = plain mean over the 7 tasks.
- Regimes: ``target`` = per task, all its sentences (transductive, BERT-flow's default); ``nli`` = one fit on the
  SNLI dev+test sentences; ``train`` = STS-B / SICK-R train split only (2 tasks, reported separately).
- Fitting never sees a label. The only labels used for a choice are STS-B *dev* labels (the alpha table).
- Flow: ``FlowCalibrator("code")`` (the official code's Glow, 1 epoch), mean ± sample std over ``--flow-seeds``
  seeds 0..N-1. Every other calibrator is deterministic.

Usage (from the repository root; regenerates docs/results/beyond.json and docs/results/beyond.md)::

    python benchmarks/beyond.py --flow-seeds 3 --output docs/results/beyond
    python benchmarks/beyond.py --model sentence-transformers/all-mpnet-base-v2 --flow-seeds 3 --no-ablation \
        --output docs/results/beyond-mpnet
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bertflow.calibrators import (
    AnchoredWhiteningCalibrator,
    Calibrator,
    ChainCalibrator,
    FlowCalibrator,
    IdentityCalibrator,
    StandardNormCalibrator,
    WhiteningCalibrator,
    parse_calibrator,
)
from bertflow.calibrators.anchored import anisotropy
from bertflow.cli.evaluate import find_data_dir
from bertflow.encoding.encoder import SentenceEncoder
from bertflow.evaluation.cache import EmbeddingCache, embed_cached
from bertflow.evaluation.datasets import load_nli_sentences, load_sts_tasks
from bertflow.evaluation.sts import evaluate_pairs, evaluate_task

POOLINGS = ("mean", "cls", "first-last-avg", "last2avg")
Factory = Callable[[], Calibrator]


class Table:
    """Embeddings of every needed sentence, per pooling, looked up by sentence."""

    def __init__(self, encoder: SentenceEncoder, sentences: list[str], poolings: list[str], cache: EmbeddingCache):
        self.index = {s: i for i, s in enumerate(sentences)}
        t0 = time.perf_counter()
        self.emb = embed_cached(encoder, sentences, poolings, cache=cache)
        self.encode_seconds = time.perf_counter() - t0

    def get(self, pooling: str, sentences: list[str]) -> np.ndarray:
        return self.emb[pooling][[self.index[s] for s in sentences]]


def score(table: Table, tasks: dict, pooling: str, regime: str, factory: Factory, nli: list[str]) -> dict:
    """Fit ``factory()`` under ``regime`` and score each task it applies to; ``{task: (all, wmean)}``."""
    out: dict[str, tuple[float, float]] = {}
    shared: Calibrator | None = None
    for name, task in tasks.items():
        if regime == "nli":
            if shared is None:
                shared = factory().fit(table.get(pooling, nli))
            cal = shared
        elif regime == "train":
            if not task.has_train_split:
                continue
            cal = factory().fit(table.get(pooling, task.fit_sentences("train")))
        else:
            cal = factory().fit(table.get(pooling, task.fit_sentences("target")))
        ts = evaluate_task(task, lambda s, c=cal: c.transform(table.get(pooling, s)))  # noqa: B023
        out[name] = (ts.score("all"), ts.score("wmean"))
    return out


def averages(per_task: dict) -> tuple[float, float]:
    return float(np.mean([v[0] for v in per_task.values()])), float(np.mean([v[1] for v in per_task.values()]))


def likelihood_shrinkage(X: np.ndarray, grid: list[float], seed: int = 0) -> float:
    """lambda of W = (S + lambda s_bar I)^-1/2 maximising the held-out (20%) Gaussian log-likelihood."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(X))
    cut = int(0.8 * len(X))
    fit, held = X[perm[:cut]], X[perm[cut:]]
    mu = fit.mean(0)
    s, u = np.linalg.eigh(np.cov(fit - mu, rowvar=False))
    s = s.clip(min=0)
    proj = (held - mu) @ u
    best, best_ll = grid[0], -np.inf
    for lam in grid:
        v = s + lam * s.mean()
        if (v <= 1e-12 * s.max()).any():
            continue  # singular covariance: the likelihood is undefined
        ll = -0.5 * (np.log(v).sum() + ((proj**2) / v).sum(1).mean())
        if ll > best_ll:
            best, best_ll = lam, ll
    return best


class LikelihoodShrinkage(WhiteningCalibrator):
    """Ablation only: whitening with shrinkage chosen per fit by held-out Gaussian likelihood."""

    GRID = [0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]

    def _fit(self, X: np.ndarray) -> None:
        self.shrinkage = likelihood_shrinkage(X, self.GRID)
        self.chosen_.append(self.shrinkage)
        super()._fit(X)

    chosen_: list[float] = []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="hub id or folder (default: the embedded all-MiniLM-L6-v2)")
    ap.add_argument("--poolings", default=",".join(POOLINGS))
    ap.add_argument("--ablation", action=argparse.BooleanOptionalAction, default=True, help="the ablation rows")
    ap.add_argument("--flow-seeds", type=int, default=1, help="flow seeds (0: no flow rows)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--cache-dir", default=None, help="embedding cache (default ~/.cache/bertflow/embeddings)")
    ap.add_argument("--output", default="docs/results/beyond", help="writes OUTPUT.json and OUTPUT.md")
    args = ap.parse_args()
    args.data_dir = find_data_dir(args.data_dir)  # as the CLI finds it when --data-dir is not given
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    poolings = args.poolings.split(",")
    tasks = load_sts_tasks(data_dir=args.data_dir)
    nli = load_nli_sentences(args.data_dir)
    sentences = list(dict.fromkeys([s for t in tasks.values() for s in t.fit_sentences("target")] + nli))
    encoder = SentenceEncoder(args.model, pooling="mean")
    table = Table(encoder, sentences, poolings, EmbeddingCache(args.cache_dir))
    results: dict = {"cells": [], "alpha_dev": {}, "weight_dev": {}, "anisotropy": {}}

    def cell(pooling: str, method: str, regime: str, factory: Factory, seeds: list | None = None) -> dict:
        t0 = time.perf_counter()
        runs = []
        for seed in seeds or [None]:
            per_task = score(table, tasks, pooling, regime, (lambda s=seed: factory(s)) if seeds else factory, nli)
            runs.append(per_task)
        avg = [averages(r) for r in runs]
        rec = {
            "pooling": pooling,
            "method": method,
            "regime": regime,
            "seeds": seeds,
            "tasks": {t: [float(np.mean([r[t][i] for r in runs])) for i in (0, 1)] for t in runs[0]},
            "all": float(np.mean([a[0] for a in avg])),
            "wmean": float(np.mean([a[1] for a in avg])),
            "all_std": float(statistics.stdev([a[0] for a in avg])) if len(avg) > 1 else None,
            "wmean_std": float(statistics.stdev([a[1] for a in avg])) if len(avg) > 1 else None,
            "seconds": time.perf_counter() - t0,
        }
        results["cells"].append(rec)
        print(f"{pooling:15s} {method:34s} {regime:6s} all {rec['all']:6.2f} wmean {rec['wmean']:6.2f}", flush=True)
        return rec

    main_methods: dict[str, Factory] = {
        "whitening": WhiteningCalibrator,
        "anchored (alpha 0.5, weight = anisotropy)": AnchoredWhiteningCalibrator,
    }
    ablation: dict[str, Factory] = {
        "centring only": lambda: AnchoredWhiteningCalibrator(0.0, weight=1.0),
        "partial whitening alpha 0.5": lambda: AnchoredWhiteningCalibrator(0.5, weight=1.0),
        "shrinkage whitening, lambda by held-out lik.": LikelihoodShrinkage,
        "standard-norm": StandardNormCalibrator,
        "all-but-the-top k=1": lambda: parse_calibrator("natsv-1"),
        "fixed mix 0.5: raw + alpha 0.5": lambda: AnchoredWhiteningCalibrator(0.5, weight=0.5),
        "anchored alpha 0 (raw + centred)": lambda: AnchoredWhiteningCalibrator(0.0),
        "anchored alpha 0.25": lambda: AnchoredWhiteningCalibrator(0.25),
        "anchored alpha 0.75": lambda: AnchoredWhiteningCalibrator(0.75),
        "anchored alpha 1 (raw + whitening)": lambda: AnchoredWhiteningCalibrator(1.0),
    }
    seeds = list(range(args.flow_seeds))
    for pooling in poolings:
        results["anisotropy"][pooling] = {
            "target (STS-B)": anisotropy(table.get(pooling, tasks["STS-B"].fit_sentences("target"))),
            "nli": anisotropy(table.get(pooling, nli)),
        }
        cell(pooling, "raw", "none", IdentityCalibrator)
        for regime in ("target", "nli", "train"):
            if seeds and regime != "train":
                cell(pooling, "flow", regime, lambda s: parse_calibrator("flow", seed=s), seeds)
            for method, factory in main_methods.items():
                cell(pooling, method, regime, factory)
        cell(pooling, "raw", "train", IdentityCalibrator)
        for regime in ("target", "nli") if args.ablation else ():
            if seeds:  # the flow on whitened inputs: the Glow then starts from an isotropic Gaussian fit
                cell(
                    pooling,
                    "whitening, then flow",
                    regime,
                    lambda s: ChainCalibrator([WhiteningCalibrator(), FlowCalibrator(seed=s)]),
                    seeds,
                )
                # The paper's flow with affine coupling and learned LU 1x1 convolutions instead of the code's.
                cell(
                    pooling,
                    "flow, paper preset, affine + LU",
                    regime,
                    lambda s: FlowCalibrator("paper", coupling="affine", permutation="lu", seed=s),
                    seeds,
                )
                # Longer training with label-free early stopping: up to 5 epochs, the step with the best NLL on a
                # 10% held-out share of the fitting sentences is kept.
                cell(
                    pooling,
                    "flow, 5 epochs, held-out NLL early stopping",
                    regime,
                    lambda s: FlowCalibrator(epochs=5, validation_fraction=0.1, eval_every=50, seed=s),
                    seeds,
                )
            for method, factory in ablation.items():
                LikelihoodShrinkage.chosen_ = []
                rec = cell(pooling, method, regime, factory)
                if LikelihoodShrinkage.chosen_:
                    rec["chosen_lambda"] = sorted(set(LikelihoodShrinkage.chosen_))
        # alpha by STS-B dev labels: fit on the STS-B sentences (no labels), score the dev pairs.
        stsb = tasks["STS-B"]
        dev = {"dev": stsb.splits["dev"]}
        x_fit = table.get(pooling, stsb.fit_sentences("target"))
        row = {"raw": evaluate_pairs("dev", dev, lambda s, p=pooling: table.get(p, s)).score("all")}
        for a in (0.0, 0.25, 0.5, 0.75, 1.0):
            cal = AnchoredWhiteningCalibrator(a).fit(x_fit)
            row[str(a)] = evaluate_pairs("dev", dev, lambda s, c=cal, p=pooling: c.transform(table.get(p, s))).score(
                "all"
            )
        results["alpha_dev"][pooling] = row
        print(pooling, "STS-B dev", {k: round(v, 2) for k, v in row.items()}, flush=True)
        # The mix weight rule beta = anisotropy ** gamma (gamma 1 is the rule), also on STS-B dev.
        a = anisotropy(x_fit)
        wrow = {"raw": row["raw"], "anisotropy": a}
        for g in (0.5, 1.0, 1.5, 2.0):
            cal = AnchoredWhiteningCalibrator(0.5, weight=a**g).fit(x_fit)
            wrow[str(g)] = evaluate_pairs("dev", dev, lambda s, c=cal, p=pooling: c.transform(table.get(p, s))).score(
                "all"
            )
        results["weight_dev"][pooling] = wrow
        print(pooling, "STS-B dev, weight = anisotropy ** gamma", {k: round(v, 3) for k, v in wrow.items()}, flush=True)

    results["meta"] = {
        "command": "python benchmarks/beyond.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "model": encoder.model_id,
        "fingerprint": encoder.fingerprint(),
        "max_length": encoder.max_length,
        "distinct_sentences": len(sentences),
        "encode_seconds": table.encode_seconds,
        "total_seconds": time.perf_counter() - started,
        "machine": f"{platform.platform()}; {os.cpu_count()} CPUs; torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)",
        "tasks": list(tasks),
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(to_markdown(results), encoding="utf-8")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def _fmt(rec: dict | None, key: str, raw: float | None = None) -> str:
    if rec is None:
        return "n/a"
    v = rec[key]
    s = f"{v:.2f}"
    if rec.get(f"{key}_std") is not None:
        s += f" ± {rec[f'{key}_std']:.2f}"
    if raw is not None:
        s += f" ({v - raw:+.2f})"
    return s


def to_markdown(res: dict) -> str:
    cells = res["cells"]
    poolings = list(res["anisotropy"])

    def find(p: str, m: str, r: str) -> dict | None:
        return next((c for c in cells if c["pooling"] == p and c["method"] == m and c["regime"] == r), None)

    anchored = "anchored (alpha 0.5, weight = anisotropy)"
    lines = [
        f"Generated by `{res['meta']['command']}`; {res['meta']['machine']}; {res['meta']['total_seconds']:.0f} s.",
        "",
    ]
    lines += ["### Main table: 7-task average, Spearman x100 (difference to raw in brackets)", ""]
    lines += ['| pooling | anisotropy | method | regime | Avg "all" | Avg "wmean" |', "|---|---:|---|---|---:|---:|"]
    for p in poolings:
        raw = find(p, "raw", "none")
        lines.append(
            f"| {p} | {res['anisotropy'][p]['target (STS-B)']:.3f} | raw | none | {_fmt(raw, 'all')} | "
            f"{_fmt(raw, 'wmean')} |"
        )
        for r in ("target", "nli"):
            for m in ("flow", "whitening", anchored):
                c = find(p, m, r)
                if c is None:
                    continue
                name = f"**{m}**" if m == anchored else m
                lines.append(
                    f"| {p} | | {name} | {r} | {_fmt(c, 'all', raw['all'])} | {_fmt(c, 'wmean', raw['wmean'])} |"
                )
    lines += ["", "### Train regime (STS-B and SICK-R only; fitted on their train split; 2-task average)", ""]
    lines += ['| pooling | method | Avg "all" (= wmean) |', "|---|---|---:|"]
    for p in poolings:
        raw = find(p, "raw", "train")
        for m in ("raw", "flow", "whitening", anchored):
            c = find(p, m, "train")
            if c is not None:
                lines.append(f"| {p} | {m} | {_fmt(c, 'all', None if m == 'raw' else raw['all'])} |")
    lines += ["", '### Per task, anchored (target) vs raw, "all"', ""]
    tnames = res["meta"]["tasks"]
    lines += ["| pooling | method | " + " | ".join(tnames) + " | Avg |", "|---|---|" + "---:|" * (len(tnames) + 1)]
    for p in poolings:
        for m, r in (("raw", "none"), (anchored, "target"), (anchored, "nli")):
            c = find(p, m, r)
            cells_ = " | ".join(f"{c['tasks'][t][0]:.2f}" for t in tnames)
            lines.append(f"| {p} | {m if m == 'raw' else 'anchored ' + r} | {cells_} | {c['all']:.2f} |")
    lines += ["", '### Ablation: 7-task average "all" / "wmean" (difference to raw, "all")', ""]
    methods = list(dict.fromkeys(c["method"] for c in cells if c["regime"] in ("target", "nli")))
    lines += ["| method | regime | " + " | ".join(poolings) + " |", "|---|---|" + "---:|" * len(poolings)]
    for m in methods:
        for r in ("target", "nli"):
            row = []
            for p in poolings:
                c, raw = find(p, m, r), find(p, "raw", "none")
                row.append("n/a" if c is None else f"{c['all']:.2f} / {c['wmean']:.2f} ({c['all'] - raw['all']:+.2f})")
                if c is not None and "chosen_lambda" in c:
                    row[-1] += f" λ∈{c['chosen_lambda']}"
            lines.append(f"| {m} | {r} | " + " | ".join(row) + " |")
    lines += [
        "",
        "### Choosing alpha with STS-B dev labels (anchored, fitted on the STS-B sentences; Spearman x100 "
        "on STS-B dev)",
        "",
    ]
    alphas = ["raw", "0.0", "0.25", "0.5", "0.75", "1.0"]
    lines += [
        "| pooling | " + " | ".join(f"alpha {a}" if a != "raw" else "raw" for a in alphas) + " |",
        "|---|" + "---:|" * len(alphas),
    ]
    for p in poolings:
        lines.append(f"| {p} | " + " | ".join(f"{res['alpha_dev'][p][a]:.2f}" for a in alphas) + " |")
    lines += [
        "",
        "### Choosing the mix weight rule with STS-B dev labels (anchored alpha 0.5, weight = anisotropy ** gamma; "
        "Spearman x100 on STS-B dev, difference to raw)",
        "",
    ]
    gammas = ["0.5", "1.0", "1.5", "2.0"]
    lines += [
        "| pooling | anisotropy | raw | " + " | ".join(f"gamma {g}" for g in gammas) + " |",
        "|---|---:|---:|" + "---:|" * len(gammas),
    ]
    for p in poolings:
        w = res["weight_dev"][p]
        cells_ = " | ".join(f"{w[g] - w['raw']:+.3f}" for g in gammas)
        lines.append(f"| {p} | {w['anisotropy']:.3f} | {w['raw']:.2f} | {cells_} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
