"""Can any label-free linear recalibration beat BERT-whitening on a raw MLM encoder? (issue 14, section 2)

Every row is a calibrator fitted without labels, scored like ``bertflow reproduce``: 7 STS tasks, Spearman x100
of the cosine, Avg "all" / "wmean"; regimes ``target`` (each task's own sentences) and ``nli`` (SNLI dev+test
sentences). Encoder ``--model`` (default: the raw bert-gutenberg-L6-H384), max_length 64, float32 on CPU,
embeddings from the shared cache.

The variants (written here, not part of the library, since none of them wins):

- partial / over-whitening: directions scaled by lambda^(-alpha/2), alpha in {0.75, 1.25, 1.5};
- whitening-k: the top k directions only (k = 64, 128);
- all-but-the-top then whitening: the top 1 or 3 principal directions dropped, the rest whitened;
- shrinkage: (S + lambda * mean eigenvalue * I)^(-1/2), lambda in {0.01, 0.1};
- whitening of unit-length embeddings;
- marginal Gaussianisation: whitening, then each coordinate mapped through its empirical CDF to N(0, 1);
- frequency directions removed: whitening, then the directions of the whitened space that linearly predict each
  sentence's token count and mean token log-frequency (counted on the fitting corpus itself) projected out
  (the paper's Table 6 link between word frequency and the embedding geometry);
- raw + whitened cosine mixed with a fixed weight w (anchored whitening with alpha 1).

Usage (from the repository root; writes docs/results/raw_ablation.json and .md)::

    python benchmarks/raw_ablation.py --output docs/results/raw_ablation
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond import Table, averages, score  # noqa: E402

from bertflow.calibrators import AnchoredWhiteningCalibrator, IdentityCalibrator  # noqa: E402
from bertflow.cli.evaluate import find_data_dir
from bertflow.encoding.encoder import SentenceEncoder
from bertflow.evaluation.cache import EmbeddingCache  # noqa: E402
from bertflow.evaluation.datasets import load_nli_sentences, load_sts_tasks
from bertflow.linalg import unit_rows  # noqa: E402

Map = Callable[[np.ndarray], np.ndarray]


class Fitted:
    """A calibrator made of a fitting function ``X -> (Y -> Z)`` (enough for :func:`beyond.score`)."""

    def __init__(self, fit: Callable[[np.ndarray], Map]) -> None:
        self._fit = fit

    def fit(self, X: np.ndarray) -> Fitted:
        self._map = self._fit(np.asarray(X, np.float64))
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        return self._map(np.asarray(X, np.float64))


def whiten(alpha: float = 1.0, shrink: float = 0.0, drop: int = 0, k: int | None = None, unit: bool = False):
    def fit(X: np.ndarray) -> Map:
        Xf = unit_rows(X) if unit else X
        mu = Xf.mean(0)
        s, U = np.linalg.eigh(np.cov(Xf - mu, rowvar=False))
        s, U = s[::-1], U[:, ::-1]
        s = np.clip(s, 1e-12 * s[0], None) + shrink * s.mean()
        W = (U / s ** (alpha / 2))[:, drop:k]
        return lambda Y: ((unit_rows(Y) if unit else Y) - mu) @ W

    return fit


def gaussianise(X: np.ndarray) -> Map:
    t = whiten()(X)
    q = np.sort(t(X), axis=0)
    n = len(q)

    def apply(Y: np.ndarray) -> np.ndarray:
        Z = t(Y)
        ranks = np.stack([np.searchsorted(q[:, j], Z[:, j]) for j in range(Z.shape[1])], axis=1) / (n + 1)
        return norm.ppf(np.clip(ranks, 0.5 / n, 1 - 0.5 / n))

    return apply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="../shared/models/bert-gutenberg-L6-H384")
    ap.add_argument("--poolings", type=lambda s: s.split(","), default=["mean", "first-last-avg"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--output", default="docs/results/raw_ablation")
    args = ap.parse_args()
    args.data_dir = find_data_dir(args.data_dir)  # as the CLI finds it when --data-dir is not given
    started = time.perf_counter()
    tasks = load_sts_tasks(data_dir=args.data_dir)
    nli = load_nli_sentences(args.data_dir)
    sentences = list(dict.fromkeys([s for t in tasks.values() for s in t.fit_sentences("target")] + nli))
    encoder = SentenceEncoder(args.model, pooling="mean")
    table = Table(encoder, sentences, args.poolings, EmbeddingCache(args.cache_dir))

    # Side features for the frequency-direction variant: token count and mean token log-frequency per sentence,
    # counted on all sentences here (unlabeled); looked up by the embedding row's position in the table.
    ids = encoder.tokenizer(sentences, add_special_tokens=False, truncation=True, max_length=62)["input_ids"]
    counts = Counter(i for row in ids for i in row)
    total = sum(counts.values())
    feats = np.array([[len(r), np.mean([np.log(counts[i] / total) for i in r]) if r else 0.0] for r in ids])
    row_of = {(p, table.emb[p][i].tobytes()): i for p in args.poolings for i in range(len(sentences))}

    def frequency_out(X: np.ndarray) -> Map:
        t = whiten()(X)
        Z = t(X)
        key = X.astype(np.float32)
        pooling = next(p for p in args.poolings if (p, key[0].tobytes()) in row_of)
        F = feats[[row_of[(pooling, x.tobytes())] for x in key]]
        F = (F - F.mean(0)) / F.std(0)
        B, *_ = np.linalg.lstsq(Z, F, rcond=None)
        Q, _ = np.linalg.qr(B)
        P = np.eye(Z.shape[1]) - Q @ Q.T
        return lambda Y: t(Y) @ P

    variants: dict[str, Callable[[], object]] = {
        "raw": IdentityCalibrator,
        "whitening": lambda: Fitted(whiten()),
        "whitening alpha 0.75": lambda: Fitted(whiten(0.75)),
        "whitening alpha 1.25": lambda: Fitted(whiten(1.25)),
        "whitening alpha 1.5": lambda: Fitted(whiten(1.5)),
        "whitening-128": lambda: Fitted(whiten(k=128)),
        "whitening-64": lambda: Fitted(whiten(k=64)),
        "top 1 dropped, whitening": lambda: Fitted(whiten(drop=1)),
        "top 3 dropped, whitening": lambda: Fitted(whiten(drop=3)),
        "shrinkage 0.01": lambda: Fitted(whiten(shrink=0.01)),
        "shrinkage 0.1": lambda: Fitted(whiten(shrink=0.1)),
        "whitening of unit vectors": lambda: Fitted(whiten(unit=True)),
        "marginal Gaussianisation": lambda: Fitted(gaussianise),
        "frequency directions removed": lambda: Fitted(frequency_out),
        "raw + whitened cosine, w 0.7": lambda: AnchoredWhiteningCalibrator(1.0, weight=0.7),
        "raw + whitened cosine, w 0.85": lambda: AnchoredWhiteningCalibrator(1.0, weight=0.85),
    }
    rows = []
    for pooling in args.poolings:
        for name, factory in variants.items():
            rec = {"pooling": pooling, "method": name}
            for regime in ("target", "nli") if name != "raw" else ("target",):
                a = averages(score(table, tasks, pooling, regime, factory, nli))
                rec[regime] = {"all": a[0], "wmean": a[1]}
            rows.append(rec)
            print(pooling, name, {r: rec[r] for r in ("target", "nli") if r in rec}, flush=True)
    meta = {
        "command": f"python benchmarks/raw_ablation.py --model {args.model} --poolings {','.join(args.poolings)} "
        f"--output {args.output}",
        "model": encoder.model_id,
        "machine": f"{platform.platform()}; {os.cpu_count()} CPUs; torch {torch.__version__}",
        "seconds": time.perf_counter() - started,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "meta": meta}, indent=1) + "\n", encoding="utf-8")
    lines = [f"Generated by `{meta['command']}`; {meta['machine']}; {meta['seconds']:.0f} s.", ""]
    lines += [
        '| pooling | method | target "all" / "wmean" | vs whitening | nli "all" / "wmean" |',
        "|---|---|---|---|---|",
    ]
    for pooling in args.poolings:
        white = next(r for r in rows if r["pooling"] == pooling and r["method"] == "whitening")["target"]
        for r in (r for r in rows if r["pooling"] == pooling):
            t, n = r["target"], r.get("nli")
            lines.append(
                f"| {pooling} | {r['method']} | {t['all']:.2f} / {t['wmean']:.2f} | "
                f"{t['all'] - white['all']:+.2f} / {t['wmean'] - white['wmean']:+.2f} | "
                + (f"{n['all']:.2f} / {n['wmean']:.2f}" if n else "")
                + " |"
            )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
