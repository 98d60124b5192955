"""Issue 23, eleventh pass: where one chunk's device time goes, by kernel (torch.profiler, CUDA activity), for the
packed forward as it runs by default: one 16,384-sentence STS chunk launched three times after a warm-up; the
kernels' total device time grouped by name, largest first, with the share of the whole. Run from a folder holding
``tok/`` and ``sts/``: ``python kernel_probe.py ARCH``.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]


def main() -> None:
    import tempfile

    import gpu_checks as g
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bertflow import SentenceEncoder

    arch = sys.argv[1]
    pool = g.sts_pool(Path("sts"))
    text = [pool[i] for i in np.random.default_rng(0).permutation(np.arange(16384) % len(pool))]
    with tempfile.TemporaryDirectory() as tmp:
        enc = SentenceEncoder(str(g.random_model(arch, Path("tok"), Path(tmp) / arch)), pooling="mean", device="cuda")
        enc.encode(g.synthetic(Path("tok"), 20000), show_progress_bar=False)
        chunk = enc.prepare_chunk((0, text), enc.token_budget, None, pooled=False)
        plan, runner = enc._plan(None), enc._runner
        for _ in range(2):
            runner.launch(chunk, plan, None, None, False, None)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                runner.launch(chunk, plan, None, None, False, None)
            torch.cuda.synchronize()
    totals: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:90]
            totals[name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            counts[name] += 1
    whole = sum(totals.values())
    print(f"{arch}: {whole / 3e3:.2f} ms of kernels a chunk ({len(chunk.batches)} batches, {chunk.n} sentences)")
    rows = []
    for name, us in totals.most_common(25):
        rows.append(
            {
                "kernel": name,
                "ms_per_chunk": round(us / 3e3, 3),
                "share": round(us / whole, 4),
                "launches_per_chunk": counts[name] // 3,
            }
        )
        print(f"  {us / 3e3:8.3f} ms {100 * us / whole:5.1f}%  x{counts[name] // 3:<4d} {name}")
    print(json.dumps({"arch": arch, "card": g.card(), "kernels": rows}))


if __name__ == "__main__":
    main()
