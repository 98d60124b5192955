"""Exploration for issue 17 item 1: which SDPA kernel should short sentences use?

A profile of the eager BERT-base forward on a 4096 x 16 batch (benchmarks/bert_compile_gpu.py --profile, H100)
put attention at about a quarter of the GPU time, although it is about 1% of the FLOPs at 16 tokens: the fused
attention kernels tile 64-128 query rows and a sentence has 16. This times, side by side in one process on a
random-weight BERT-base in bf16: the bare forward at a few (rows, width) shapes of 65,536 tokens under each SDPA
backend alone, and ``SentenceEncoder.encode`` on STS sentences with its attention backends (flash, then
memory-efficient, then math; no cuDNN) against the same encoder restricted to one backend (alternating rounds,
medians), with the largest cosine deviation of each variant's vectors from the default's.

    python benchmarks/bert_attention_gpu.py --tokenizer-dir TOK --data-dir STS
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import (
    H100_BF16_PEAK,
    build_random_model,
    environment,
    interleave,
    model_flops,
    replicate,
    sts_sentences,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

from bertflow.encoding.encoder import SentenceEncoder

BACKENDS = {
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "flash": [SDPBackend.FLASH_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "math": [SDPBackend.MATH],
}


def bare_forward(model: Any, rows: int, width: int, backends: list[SDPBackend], reps: int = 10) -> float:
    """Seconds per forward on one [rows, width] batch with padding in the mask (so every backend sees a mask)."""
    ids = torch.randint(1000, 20000, (rows, width), device="cuda")
    mask = torch.ones(rows, 1, 1, width, dtype=torch.bool, device="cuda")
    mask[::2, ..., width - width // 4 :] = False  # half the rows padded by a quarter: the encoder's usual case
    with torch.inference_mode(), sdpa_kernel(backends):
        for _ in range(3):
            model(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            model(input_ids=ids, attention_mask=mask)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--sentences", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    env = environment("cuda")
    print(f"[env] {json.dumps(env)}", flush=True)
    out: dict[str, Any] = {"environment": env}
    with tempfile.TemporaryDirectory(prefix="bertflow-attention-") as tmp:
        path = str(build_random_model("bert-base", args.tokenizer_dir, Path(tmp) / "bert-base"))
        base = SentenceEncoder(path, pooling="mean", device="cuda", max_length=64)

        forward: dict[str, Any] = {}
        for rows, width in ((4096, 16), (2048, 32), (1024, 64)):
            flops = model_flops(base.model.config, np.full(rows, width))
            for name, backends in BACKENDS.items():
                try:
                    s = bare_forward(base.model, rows, width, backends)
                except RuntimeError as e:  # a backend that cannot take this input (e.g. flash with a mask)
                    forward[f"{rows}x{width} {name}"] = {"error": str(e).splitlines()[0][:120]}
                    print(f"[forward] {rows}x{width} {name:9s} refused: {str(e).splitlines()[0][:100]}", flush=True)
                    continue
                forward[f"{rows}x{width} {name}"] = {"ms": 1e3 * s, "mfu": flops / s / H100_BF16_PEAK}
                print(f"[forward] {rows}x{width} {name:9s} {1e3 * s:7.2f} ms  MFU {100 * flops / s / 989e12:5.1f}%")
        out["bare_forward"] = forward

        sentences = replicate(sts_sentences(args.data_dir), args.sentences)
        lengths = np.asarray([len(x) for x in base.tokenize(sentences)])
        flops = model_flops(base.model.config, lengths)
        encoders = {"default (flash, efficient, math)": base}
        for name in ("efficient", "math"):
            enc = SentenceEncoder(
                path, pooling="mean", device="cuda", max_length=64, model=base.model, tokenizer=base.tokenizer
            )
            enc._attention_backends = lambda b=BACKENDS[name]: sdpa_kernel(b)  # this instance only
            encoders[name] = enc
        ref = base.encode(sentences).astype(np.float64)
        deviation = {}
        for name, enc in encoders.items():
            x = enc.encode(sentences).astype(np.float64)
            cos = (x * ref).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(ref, axis=1)
            deviation[name] = float(1 - cos.min())
        times = interleave({name: (lambda e=enc: e.encode(sentences)) for name, enc in encoders.items()}, args.rounds)
        out["encode"] = {}
        print(
            f"\ncard: {env.get('gpu')}; BERT-base bf16 (random weights), {len(sentences)} STS sentences, "
            f"{lengths.mean():.1f} tokens each, max_length 64, medians of {args.rounds} rounds"
        )
        for name, ts in times.items():
            t = float(np.median(ts))
            out["encode"][name] = {
                "seconds": ts,
                "sentences_per_s": len(sentences) / t,
                "mfu": flops / t / H100_BF16_PEAK,
                "max_cosine_deviation": deviation[name],
            }
            print(
                f"  encode {name:34s} {len(sentences) / t:>10,.0f} sent/s  MFU {100 * flops / t / H100_BF16_PEAK:4.1f}%"
                f"  max cosine deviation from default {deviation[name]:.1e}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
