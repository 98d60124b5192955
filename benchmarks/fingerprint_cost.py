"""Cost of the encoder fingerprint (bertflow.encoding.loading.weights_fingerprint), which hashes every parameter.

Times the fingerprint of a 6-layer 384-wide BERT and of a BERT-base-sized model (random weights, the same
computation as any checkpoint of that size) on the CPU, best of 3, and prints one Markdown row each.

    python benchmarks/fingerprint_cost.py [--model /work/shared/models/bert-gutenberg-L6-H384]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from transformers import BertConfig, BertModel

from bertflow.encoding.encoder import SentenceEncoder
from bertflow.encoding.loading import weights_fingerprint


def _best_of(n: int, fn) -> float:  # noqa: ANN001 - a callable
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/work/shared/models/bert-gutenberg-L6-H384", help="a local checkpoint")
    args = parser.parse_args()
    encoder = SentenceEncoder(args.model, pooling="cls", device="cpu", dtype="float32")
    base = BertModel(BertConfig()).eval()  # BERT-base: 12 layers, 768 wide, 30,522 tokens
    print(f"CPU: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}")
    print("| model | parameters (M) | fingerprint seconds (best of 3) |")
    print("|---|---|---|")
    for name, model in ((args.model, encoder.model), ("BERT-base (random weights)", base)):
        params = sum(p.numel() for p in model.parameters()) / 1e6
        seconds = _best_of(3, lambda m=model: weights_fingerprint(m, encoder.tokenizer))
        print(f"| {name} | {params:.1f} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
