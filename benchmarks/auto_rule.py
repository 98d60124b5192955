"""`--calibrator auto` against raw, flow, whitening and anchored, on a raw MLM encoder and contrastive encoders.

Protocol (also written into the report):

- Encoders: each ``--model`` (a raw MLM BERT and contrastive sentence encoders), max_length 64, float32 on CPU;
  embeddings read from the shared embedding cache (:func:`bertflow.evaluation.cache.embed_cached`), every pooling
  in one pass.
- Tasks: STS12-16, STS-B test, SICK-R test; Spearman x100 of cosine; "all" and "wmean"; Avg = plain mean over the
  7 tasks. Regimes: ``target`` = per task, all its sentences (transductive); ``nli`` = one fit on the SNLI dev+test
  sentences; ``train`` = STS-B / SICK-R train split only (2 tasks, reported apart).
- No labels anywhere. The rule's two thresholds were set from the spread of the fitting embeddings of one raw and
  one contrastive encoder (all-MiniLM-L6-v2), unlabeled; all-mpnet-base-v2 was not looked at before.
- Flow: ``FlowCalibrator("code")``, 1 epoch, seeds 0..N-1, mean ± std (``--flow-seeds``, or ``--flow-from``).

Usage (from the repository root; regenerates docs/results/auto_rule.json and .md)::

    python benchmarks/auto_rule.py --model ../shared/models/bert-gutenberg-L6-H384 \
        --model sentence-transformers/all-MiniLM-L6-v2 --model PATH/all-mpnet-base-v2 \
        --flow-from docs/results/bert-gutenberg-L6-H384/reproduce.json --output docs/results/auto_rule

The flow column of the raw encoder comes from the grid report named by ``--flow-from`` (the same fits:
``FlowCalibrator("code")``, seeds 0, 1, 2, CPU); ``--flow-seeds 3`` fits them here instead (about 20 more minutes
on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond import Table, averages, score  # noqa: E402

from bertflow.calibrators import (  # noqa: E402
    AnchoredWhiteningCalibrator,
    AutoCalibrator,
    Calibrator,
    FlowCalibrator,
    IdentityCalibrator,
    WhiteningCalibrator,
)
from bertflow.calibrators.anchored import anisotropy  # noqa: E402
from bertflow.calibrators.auto import spread  # noqa: E402
from bertflow.encoding.encoder import SentenceEncoder
from bertflow.evaluation.cache import EmbeddingCache  # noqa: E402
from bertflow.evaluation.datasets import load_nli_sentences, load_sts_tasks

POOLINGS = ("mean", "first-last-avg", "last2avg", "cls")
METHODS: dict[str, Callable[[], Calibrator]] = {
    "whitening": WhiteningCalibrator,
    "anchored": AnchoredWhiteningCalibrator,
    "auto": AutoCalibrator,
}


def fit_sets(tasks: dict, nli: list[str]) -> dict[str, list[str]]:
    """Every set a calibrator is fitted on in this benchmark, by name."""
    sets = {f"{name} target": t.fit_sentences("target") for name, t in tasks.items()}
    sets |= {f"{name} train": t.fit_sentences("train") for name, t in tasks.items() if t.has_train_split}
    sets["nli"] = nli
    return sets


def run_model(model: str, args: argparse.Namespace, tasks: dict, nli: list[str]) -> dict:
    sentences = list(dict.fromkeys([s for t in tasks.values() for s in t.fit_sentences("target")] + nli))
    encoder = SentenceEncoder(model, pooling="mean")
    table = Table(encoder, sentences, list(args.poolings), EmbeddingCache(args.cache_dir))
    out: dict = {"model": encoder.model_id, "fingerprint": encoder.fingerprint(), "cells": [], "geometry": {}}
    for pooling in args.poolings:
        # What the rule sees: spread and anisotropy of every fitting set, and the share of whitening it picks.
        geo = {}
        for name, fit in fit_sets(tasks, nli).items():
            X = table.get(pooling, fit)
            geo[name] = {
                "spread": spread(X),
                "anisotropy": anisotropy(X),
                "rawness": AutoCalibrator().fit(X).rawness_,
            }
        out["geometry"][pooling] = geo

        def cell(method: str, regime: str, factory: Callable, seeds: list[int] | None = None, p: str = pooling):
            runs = [
                score(table, tasks, p, regime, (lambda s=s: factory(s)) if seeds else factory, nli)
                for s in seeds or [None]
            ]
            avg = [averages(r) for r in runs]
            rec = {
                "pooling": p,
                "method": method,
                "regime": regime,
                "seeds": seeds,
                "all": float(np.mean([a[0] for a in avg])),
                "wmean": float(np.mean([a[1] for a in avg])),
                "all_std": float(statistics.stdev([a[0] for a in avg])) if len(avg) > 1 else None,
                "wmean_std": float(statistics.stdev([a[1] for a in avg])) if len(avg) > 1 else None,
                "tasks": {t: [float(np.mean([r[t][i] for r in runs])) for i in (0, 1)] for t in runs[0]},
            }
            out["cells"].append(rec)
            print(
                f"{out['model'][-24:]:24s} {p:15s} {method:10s} {regime:6s} all {rec['all']:6.2f} "
                f"wmean {rec['wmean']:6.2f}",
                flush=True,
            )

        cell("raw", "none", IdentityCalibrator)
        cell("raw", "train", IdentityCalibrator)
        for regime in ("target", "nli", "train"):
            if args.flow_seeds and model in args.flow_models:
                cell("flow", regime, lambda s: FlowCalibrator(seed=s), list(range(args.flow_seeds)))
            for method, factory in METHODS.items():
                cell(method, regime, factory)
    return out


def flow_cells(report: str) -> list[dict]:
    """The flow cells (code preset) of a ``bertflow reproduce`` report, as this benchmark's records. The train
    regime has no 7-task average there: its average is the mean of the tasks it scored (STS-B, SICK-R)."""
    out = []
    for c in json.loads(Path(report).read_text(encoding="utf-8"))["cells"]:
        if c["calibrator"] != "flow" or c["regime"] not in ("target", "nli", "train") or c.get("error"):
            continue
        rec = {"pooling": c["pooling"], "method": "flow", "regime": c["regime"], "seeds": c["seeds"], "source": report}
        for key in ("all", "wmean"):
            avg = c["average"][key]
            if avg is None:
                scored = [t[key]["mean"] for t in c["tasks"].values() if t is not None]
                rec[key], rec[f"{key}_std"] = float(np.mean(scored)), None
            else:
                rec[key], rec[f"{key}_std"] = avg["mean"], avg["std"]
        out.append(rec)
    return out


def find(cells: list[dict], p: str, m: str, r: str) -> dict | None:
    return next((c for c in cells if c["pooling"] == p and c["method"] == m and c["regime"] == r), None)


def _v(c: dict | None, key: str) -> str:
    if c is None:
        return "n/a"
    s = f"{c[key]:.2f}"
    return s + (f" ± {c[key + '_std']:.2f}" if c.get(key + "_std") is not None else "")


def to_markdown(res: dict) -> str:
    lines = [f"Generated by `{res['meta']['command']}`; {res['meta']['machine']}; {res['meta']['seconds']:.0f} s.", ""]
    for m in res["models"]:
        cells = m["cells"]
        lines += [f"### {m['model']}", "", '7-task average, Spearman x100, "all" / "wmean"; train regime: 2 tasks.', ""]
        lines += [
            "| pooling | regime | raw | flow | whitening | anchored | **auto** | auto - best other | auto - raw |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in res["poolings"]:
            for r in ("target", "nli", "train"):
                raw = find(cells, p, "raw", "none" if r != "train" else "train")
                row = {k: find(cells, p, k, r) for k in ("flow", "whitening", "anchored", "auto")}
                auto = row["auto"]
                others = [c for k, c in row.items() if k != "auto" and c is not None]
                gaps = []
                for key in ("all", "wmean"):
                    best = max(c[key] for c in others)
                    gaps.append(f"{auto[key] - best:+.2f}")
                lines.append(
                    f"| {p} | {r} | {raw['all']:.2f} / {raw['wmean']:.2f} | "
                    + " | ".join(
                        f"{_v(row[k], 'all')} / {_v(row[k], 'wmean')}" for k in ("flow", "whitening", "anchored")
                    )
                    + f" | **{auto['all']:.2f} / {auto['wmean']:.2f}** | {' / '.join(gaps)} | "
                    f"{auto['all'] - raw['all']:+.2f} / {auto['wmean'] - raw['wmean']:+.2f} |"
                )
        lines += [
            "",
            "What the rule saw (spread and anisotropy of the fitting embeddings; share of whitening chosen):",
            "",
        ]
        lines += [
            "| pooling | spread (min - max over fitting sets) | anisotropy (min - max) | whitening share (min - max) |",
            "|---|---|---|---|",
        ]
        for p in res["poolings"]:
            g = m["geometry"][p].values()
            rng = {k: (min(x[k] for x in g), max(x[k] for x in g)) for k in ("spread", "anisotropy", "rawness")}
            lines.append(f"| {p} | " + " | ".join(f"{lo:.3f} - {hi:.3f}" for lo, hi in rng.values()) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="hub id or folder; repeat for several")
    ap.add_argument("--poolings", type=lambda s: s.split(","), default=list(POOLINGS))
    ap.add_argument("--flow-seeds", type=int, default=0, help="flow rows with seeds 0..N-1 (0: none)")
    ap.add_argument(
        "--flow-models", action="append", default=None, help="models that get flow rows (default: the first --model)"
    )
    ap.add_argument(
        "--flow-from",
        action="append",
        default=[],
        help="a `bertflow reproduce` report (reproduce.json) of the first --model whose flow cells (code preset) "
        "fill the flow column instead of fitting again; repeatable",
    )
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--cache-dir", default=None, help="embedding cache (default ~/.cache/bertflow/embeddings)")
    ap.add_argument("--output", default="docs/results/auto_rule", help="writes OUTPUT.json and OUTPUT.md")
    args = ap.parse_args()
    args.flow_models = args.flow_models or args.model[:1]
    started = time.perf_counter()
    tasks = load_sts_tasks(data_dir=args.data_dir)
    nli = load_nli_sentences(args.data_dir)
    res = {"poolings": list(args.poolings), "models": [run_model(m, args, tasks, nli) for m in args.model]}
    for report in args.flow_from:
        res["models"][0]["cells"] += flow_cells(report)
    res["meta"] = {
        "command": "python benchmarks/auto_rule.py "
        + " ".join(f"--model {m}" for m in args.model)
        + f" --poolings {','.join(args.poolings)} --flow-seeds {args.flow_seeds}"
        + "".join(f" --flow-models {m}" for m in args.flow_models)
        + f" --output {args.output}",
        "machine": f"{platform.platform()}; {os.cpu_count()} CPUs; torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)",
        "seconds": time.perf_counter() - started,
        "rule": AutoCalibrator().get_params(),
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(to_markdown(res), encoding="utf-8")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
