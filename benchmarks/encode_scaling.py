"""Where the host limits GPU encoding: throughput against corpus size, with and without tokenisation.

For a random-weight model built from its config (speed does not depend on the weights), encode N STS-like
sentences (N = 40k, 200k, 1M) with the default settings, interleaved with the same encoder whose tokenisation is
replaced by a lookup of the same chunks' tokens computed beforehand ("pretokenized": everything else, packing,
transfers, the forward passes, is unchanged). The gap between the two is what tokenisation costs the pipeline.

    PYTHONPATH=src python3 benchmarks/encode_scaling.py --tokenizer-dir TOK --data-dir STS --arch minilm-l6
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np

from bertflow.bench import build_random_model, environment, interleave, replicate, sts_sentences
from bertflow.encoder import SentenceEncoder


def pretokenized(encoder: SentenceEncoder) -> SentenceEncoder:
    """``encoder`` with its chunk tokenisation memoised (keyed by the chunk's size and end sentences)."""
    compute = encoder._tokenize_arrays
    memo: dict = {}

    def lookup(sentences):  # noqa: ANN001, ANN202 - same signature as the method it replaces
        key = (len(sentences), sentences[0], sentences[-1])
        if key not in memo:
            memo[key] = compute(sentences)
        return memo[key]

    encoder._tokenize_arrays = lookup
    return encoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--arch", default="minilm-l6")
    ap.add_argument("--sizes", default="40000,200000,1000000")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    base = sts_sentences(args.data_dir)
    out = {"environment": environment(args.device), "arch": args.arch, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_random_model(args.arch, args.tokenizer_dir, f"{tmp}/model"))
        for n in (int(x) for x in args.sizes.split(",")):
            sentences = replicate(base, n)
            plain = SentenceEncoder(path, device=args.device)
            pre = pretokenized(SentenceEncoder(path, device=args.device))
            plain.encode(sentences, show_progress_bar=False)  # warm-up, and fills the lookup of `pre`
            pre.encode(sentences, show_progress_bar=False)
            runs = {
                "default": lambda e=plain, s=sentences: e.encode(s, show_progress_bar=False),
                "pretokenized": lambda e=pre, s=sentences: e.encode(s, show_progress_bar=False),
            }
            times = interleave(runs, 5 if n <= 200_000 else 2)
            out["results"][n] = {
                k: {"sentences_per_s_median": n / float(np.median(v)), "runs": [n / t for t in v]}
                for k, v in times.items()
            }
            for k, v in out["results"][n].items():
                rates = ", ".join(f"{r:,.0f}" for r in v["runs"])
                print(f"{args.arch} {n:>9,} {k:>13}: median {v['sentences_per_s_median']:,.0f} sent/s ({rates})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
