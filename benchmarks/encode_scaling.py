"""Where the host limits GPU encoding: throughput against corpus size, with and without tokenisation.

For a random-weight model built from its config (speed does not depend on the weights), encode N STS-like
sentences (N = 40k, 200k, 1M) with each number of tokenisation worker processes asked for (``auto``: the
encoder's default; 0: tokenise in-process), interleaved with the same encoder whose tokenisation is replaced by a
lookup of the same chunks' tokens computed beforehand ("pretokenized": everything else, packing, transfers, the
forward passes, is unchanged). The gap to "pretokenized" is what tokenisation costs the pipeline.

    PYTHONPATH=src python3 benchmarks/encode_scaling.py --tokenizer-dir TOK --data-dir STS --arch minilm-l6 \
        --processes auto,0,2,4,8
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np
from harness import build_random_model, environment, interleave, replicate, sts_sentences

from bertflow.encoding.encoder import SentenceEncoder


def pretokenized(encoder: SentenceEncoder) -> SentenceEncoder:
    """``encoder`` with its chunk tokenisation memoised (keyed by the chunk's size and end sentences)."""
    compute = encoder.chunk_tokenizer.tokenize
    memo: dict = {}

    def lookup(sentences, pooled=True):  # noqa: ANN001, ANN202 - same signature as the method it replaces
        key = (len(sentences), sentences[0], sentences[-1])
        if key not in memo:
            memo[key] = compute(sentences, pooled)
        return memo[key]

    encoder.chunk_tokenizer.tokenize = lookup
    return encoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--arch", default="minilm-l6")
    ap.add_argument("--sizes", default="40000,200000,1000000")
    ap.add_argument(
        "--processes",
        default="auto,0",
        help="tokenisation worker-process counts to compare ('auto': the encoder's default; 0: in this process)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="rounds per setting up to 200k sentences (2 above)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    base = sts_sentences(args.data_dir)
    out = {"environment": environment(args.device), "arch": args.arch, "results": {}}
    counts = [None if p == "auto" else int(p) for p in args.processes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_random_model(args.arch, args.tokenizer_dir, f"{tmp}/model"))
        encoders = {}
        for count in counts:
            enc = SentenceEncoder(path, device=args.device, tokenize_processes=count)
            encoders[f"processes={enc.tokenize_processes}" + (" (default)" if count is None else "")] = enc
        encoders["pretokenized"] = pretokenized(SentenceEncoder(path, device=args.device, tokenize_processes=0))
        for n in (int(x) for x in args.sizes.split(",")):
            sentences = replicate(base, n)
            for enc in encoders.values():  # warm-up; starts the worker processes and fills the lookup
                enc.encode(sentences, show_progress_bar=False)
            runs = {
                name: (lambda e=enc, s=sentences: e.encode(s, show_progress_bar=False))
                for name, enc in encoders.items()
            }
            times = interleave(runs, args.rounds if n <= 200_000 else 2)
            out["results"][n] = {
                k: {"sentences_per_s_median": n / float(np.median(v)), "runs": [n / t for t in v]}
                for k, v in times.items()
            }
            for k, v in out["results"][n].items():
                rates = ", ".join(f"{r:,.0f}" for r in v["runs"])
                print(f"{args.arch} {n:>9,} {k:>24}: median {v['sentences_per_s_median']:,.0f} sent/s ({rates})")
        for enc in encoders.values():
            enc.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
