"""Whitening fitted on fewer sentences than dimensions: the collapse of the old behaviour and the shrinkage fix.

Protocol: STS-B test (1,379 pairs), all-MiniLM-L6-v2 (the embedded default, mean pooling, max_length 64, CPU,
float32). For P pairs drawn at random (seed 0), whitening is fitted on their 2P sentences (the "target" regime at
a small scale) and scored by Spearman x 100 on those same P pairs ("fitted pairs") and on 1,000 other pairs
("held-out pairs"); raw is the uncalibrated cosine. ``shrinkage=0`` is the behaviour before issue 13 (every
direction with variance whitened); the default now shrinks a singular covariance (N <= D) by OAS.

    python benchmarks/small_whitening.py [--data-dir ../shared/data/sts]

Prints a Markdown table (docs/robustness-silent.md quotes it).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
from scipy.stats import spearmanr

from bertflow import SentenceEncoder, WhiteningCalibrator
from bertflow.cli.evaluate import find_data_dir
from bertflow.evaluation.datasets import load_sts_task
from bertflow.linalg import unit_rows


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (unit_rows(a.astype(np.float64)) * unit_rows(b.astype(np.float64))).sum(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="STS data folder (default: bertflow's resolution)")
    parser.add_argument("--pairs", default="25,100,192,250,1000", help="comma-separated numbers of fitted pairs")
    args = parser.parse_args()
    args.data_dir = find_data_dir(args.data_dir)  # as the CLI finds it when --data-dir is not given
    logging.getLogger("bertflow").setLevel(logging.ERROR)  # the shrinkage warning, once per fit

    pairs = load_sts_task("STS-B", args.data_dir).eval_subsets["test"]
    encoder = SentenceEncoder(pooling="mean", device="cpu", dtype="float32")
    a, b = encoder.encode(pairs.sentences1), encoder.encode(pairs.sentences2)
    gold = pairs.scores
    rng = np.random.default_rng(0)
    print(f"encoder {encoder.model_id}, mean pooling, {encoder.dim} dims; STS-B test, {len(gold)} pairs")
    print(
        "| fitted pairs P | sentences N | scored on | raw | whitening, shrinkage=0 (before) | whitening (now) "
        "| shrinkage_ |"
    )
    print("|---|---|---|---|---|---|---|")
    for p in (int(v) for v in args.pairs.split(",")):
        order = rng.permutation(len(gold))
        fit_rows, held_rows = order[:p], order[p : p + 1000]
        X = np.vstack([a[fit_rows], b[fit_rows]])
        before, now = WhiteningCalibrator(shrinkage=0.0).fit(X), WhiteningCalibrator().fit(X)
        for label, rows in (("fitted pairs", fit_rows), ("held-out pairs", held_rows)):
            scores = [spearmanr(_cosines(a[rows], b[rows]), gold[rows])[0]]
            for cal in (before, now):
                scores.append(spearmanr(_cosines(cal.transform(a[rows]), cal.transform(b[rows])), gold[rows])[0])
            cells = " | ".join(f"{100 * s:.1f}" for s in scores)
            print(f"| {p} | {2 * p} | {label} | {cells} | {now.shrinkage_:.3g} |")


if __name__ == "__main__":
    main()
