"""Stress test of the flow: every preset x several seeds on every STS task's target sentences.

Checks, per fit, that the training loss, the latents and the log-densities are finite, and reports the final
training loss (bits/dim), the fit time and the largest |z|. Embeddings come from the shared embedding cache
(`bertflow.evaluation.cache`), so re-runs do not re-encode.

    python benchmarks/stress_flow.py                       # embedded default model, mean and cls pooling
    python benchmarks/stress_flow.py --seeds 5 --pooling first-last-avg --out docs/results/stress_flow.json

Exits non-zero if any fit produced a non-finite value or raised.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import torch

from bertflow import FlowCalibrator, SentenceEncoder
from bertflow.cli.evaluate import find_data_dir
from bertflow.evaluation.cache import EmbeddingCache, embed_cached
from bertflow.evaluation.datasets import STS_TASKS, load_sts_tasks

VARIANTS = {
    "code": {"preset": "code"},
    "paper": {"preset": "paper"},
    "affine": {"preset": "code", "coupling": "affine"},
    "lu": {"preset": "code", "permutation": "lu"},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="hub id or folder (default: embedded all-MiniLM-L6-v2)")
    parser.add_argument("--pooling", action="append", help="repeatable; default: mean and cls")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=None, help="write the JSON report here")
    args = parser.parse_args()
    args.data_dir = find_data_dir(args.data_dir)  # as the CLI finds it when --data-dir is not given
    poolings = args.pooling or ["mean", "cls"]
    encoder = SentenceEncoder(args.model, device="cpu")
    tasks = load_sts_tasks(STS_TASKS, data_dir=args.data_dir)
    target = {name: task.fit_sentences("target") for name, task in tasks.items()}
    every = list(dict.fromkeys(s for sents in target.values() for s in sents))
    embeddings = embed_cached(encoder, every, poolings, cache=EmbeddingCache())
    row_of = {s: i for i, s in enumerate(every)}
    rows, failures = [], 0
    for pooling, matrix in embeddings.items():
        for name, sents in target.items():
            x = matrix[[row_of[s] for s in sents]]
            for variant in args.variants.split(","):
                for seed in range(args.seeds):
                    started = time.perf_counter()
                    record = {"pooling": pooling, "task": name, "n": len(x), "variant": variant, "seed": seed}
                    try:
                        cal = FlowCalibrator(**VARIANTS[variant], seed=seed).fit(x)
                        z = cal.transform(x)
                        finite = bool(
                            np.isfinite(z).all()
                            and np.isfinite(cal.history_["train_bpd"]).all()
                            and np.isfinite(cal.score_samples(x)).all()
                        )
                        record.update(
                            ok=finite,
                            final_bpd=round(cal.history_["train_bpd"][-1], 4),
                            max_abs_z=round(float(np.abs(z).max()), 2),
                            passthrough=cal.passthrough_.tolist(),
                        )
                    except Exception as e:  # a stress test records every failure instead of stopping
                        record.update(ok=False, error=f"{type(e).__name__}: {e}")
                    record["seconds"] = round(time.perf_counter() - started, 2)
                    failures += not record["ok"]
                    rows.append(record)
                    print(json.dumps(record), flush=True)
    report = {
        "model": encoder.model_id,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "fits": len(rows),
        "failures": failures,
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    print(f"{len(rows)} fits, {failures} failures", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
