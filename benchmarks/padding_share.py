"""Share of a CUDA encode's token slots that are padding, per batching rule (issue 23; CPU only, no model run).

The benchmark text of ``gpu_checks.py throughput`` (``--sentences`` STS sentences in its order), tokenised with
``--tokenizer-dir`` at max_length 64, cut into the CUDA chunk ramp and batched by ``plan_batches`` as
``SentenceEncoder`` does on CUDA: for a model of each hidden width, with the padding bound of a padded forward
(``EncodeSettings.length_ratio(False)``) and without it (the packed forward). Prints batches, real tokens and
padded slots.

    PYTHONPATH=src:benchmarks python benchmarks/padding_share.py --tokenizer-dir TOK --data-dir STS
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gpu_checks import sts_pool
from transformers import AutoTokenizer

from bertflow.encoding.batching import plan_batches
from bertflow.encoding.settings import EncodeSettings
from bertflow.encoding.stream import chunk_sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=40000)
    args = parser.parse_args()
    pool = sts_pool(args.data_dir)
    rng = np.random.default_rng(0)  # gpu_checks.throughput's order
    text = [pool[i] for i in rng.permutation(np.arange(args.sentences) % len(pool))]
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer_dir))
    lengths = np.array([len(ids) for ids in tokenizer(text, truncation=True, max_length=64)["input_ids"]])
    settings = EncodeSettings()
    for hidden in (768, 384):
        for padding_free in (False, True):
            sizes, start = chunk_sizes(settings, "cuda", None), 0
            batches = slots = 0
            while start < len(lengths):
                part = np.sort(lengths[start : start + next(sizes)])[::-1]
                start += len(part)
                ratio = settings.length_ratio(padding_free)
                floor = settings.min_batch_tokens("cuda", hidden)
                for a, b in plan_batches(
                    part, settings.token_budget("cuda", hidden), None, settings.uniform_fill, ratio, floor
                ):
                    batches += 1
                    slots += (b - a) * int(part[a])
            real = int(lengths.sum())
            print(
                f"hidden {hidden}, {'packed (no bound)' if padding_free else 'padded (bound 0.9)'}: {batches} batches, "
                f"{real} real tokens in {slots} slots, padding {1 - real / slots:.3f}"
            )


if __name__ == "__main__":
    main()
