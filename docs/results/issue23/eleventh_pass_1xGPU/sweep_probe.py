"""Issue 23, eleventh pass: is a first pass slower than a warm one because its matrix products meet token counts
(M) new to the process? py-spy (call b) put 16-20 ms of a MiniLM-L6 first pass in `linear_gelu` (cuBLASLt with a
GELU epilogue) against 2-3 ms in warm passes. This runs the benchmark's process (`gpu_checks.throughput`'s setting:
random weights, bf16, mean pooling, 20,000 synthetic sentences to warm up, then 40,000 STS sentences, a first pass
and three warm ones), with, between the warm-up and the first pass, one of:

- ``none``: nothing (the benchmark as it is);
- ``full``: the layer's four products (QKV, attention output, intermediate with GELU, output) at every token count
  the packed layout can give (multiples of TOKEN_BUCKET up to the token budget);
- ``geo``: the same at about 40 token counts spaced by a factor ~1.15 (what a cheap warm-up could afford).

Run from the folder that holds ``tok/`` and ``sts/``: ``python sweep_probe.py ARCH MODE``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEVICE = os.environ.get("SWEEP_DEVICE", "cuda")  # cpu: a smoke test of this script (small counts)
sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]


def counts(mode: str, budget: int, bucket: int) -> list[int]:
    if mode == "full":
        return list(range(bucket, budget + 1, bucket))
    if mode == "geo":
        out, m = set(), float(bucket)
        while m <= budget:
            out.add(int(-(-m // bucket) * bucket))
            m *= 1.15
        return sorted(out)
    return []


def sweep(enc, mode: str) -> tuple[int, float]:
    import torch
    import torch.nn.functional as F

    from bertflow.encoding.fused import linear_gelu
    from bertflow.encoding.packed import TOKEN_BUCKET

    packed = enc._runner.packed
    layer = packed.model.encoder.layer[0]
    hidden, inter = layer.attention.output.dense.out_features, layer.intermediate.dense.out_features
    ms = counts(mode, enc.token_budget, TOKEN_BUCKET)
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    if DEVICE == "cpu":
        ms = ms[:3]
    sync()
    t = time.perf_counter()
    with torch.inference_mode():
        top = max(ms, default=0)
        weight, bias = packed._qkv_of(layer.attention.self)
        x = torch.zeros(top, hidden, device=DEVICE, dtype=weight.dtype)
        h = torch.zeros(top, inter, device=DEVICE, dtype=weight.dtype)
        for m in ms:
            F.linear(x[:m], weight, bias)
            layer.attention.output.dense(x[:m])
            linear_gelu(x[:m], layer.intermediate.dense)
            layer.output.dense(h[:m])
    sync()
    return len(ms), time.perf_counter() - t


def main() -> None:
    import tempfile

    import gpu_checks as g
    import numpy as np
    import torch

    from bertflow import SentenceEncoder

    arch, mode = sys.argv[1], sys.argv[2]
    pool = g.sts_pool(Path("sts"))
    n = 40000 if DEVICE == "cuda" else 300
    text = [pool[i] for i in np.random.default_rng(0).permutation(np.arange(n) % len(pool))]
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        enc = SentenceEncoder(str(g.random_model(arch, Path("tok"), Path(tmp) / arch)), pooling="mean", device=DEVICE)
        enc.encode(g.synthetic(Path("tok"), 20000 if DEVICE == "cuda" else 100), show_progress_bar=False)
        n, spent = sweep(enc, mode)
        rates = []
        for _ in range(4):
            sync()
            t = time.perf_counter()
            enc.encode(text, show_progress_bar=False)
            sync()
            rates.append(round(len(text) / (time.perf_counter() - t)))
    print(json.dumps({"arch": arch, "mode": mode, "token_counts": n, "sweep_s": round(spent, 3), "rates": rates}))


if __name__ == "__main__":
    main()
