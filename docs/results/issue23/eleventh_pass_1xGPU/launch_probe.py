"""Issue 23, eleventh pass: what one chunk's launch costs the main thread (host time, no other thread running) and
the device, with two cheaper ways of queueing a layer, each a variant patched in at run time:

- ``main``: the code as it is;
- ``torch-ln``: the residual add and LayerNorm as two torch ops (``norm(y + residual)``) instead of the fused Triton
  kernel (``fused.add_layer_norm``): a Triton launch costs more host time than a torch op;
- ``one-per-tile``: every attention tile holds one sentence (``per`` = 1), so that a layer's attention takes one
  launch per tile size (16, 32, 64 ...) instead of one per (tile size, sentences per tile);
- ``both``.

One 16,384-sentence STS chunk, prepared once; each variant launches it ``--rounds`` times, round-robin, each launch
timed on the host (perf_counter, the queue empty before it), then launched again behind a sleeping kernel and
timed on the device (CUDA events around the work alone); outputs compared with ``main``'s. Run from a folder
holding ``tok/`` and ``sts/``: ``python launch_probe.py ARCH [ROUNDS]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]


def main() -> None:
    import tempfile

    import gpu_checks as g
    import numpy as np
    import torch

    from bertflow import SentenceEncoder
    from bertflow.encoding import fused, packed

    arch = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    pool = g.sts_pool(Path("sts"))
    text = [pool[i] for i in np.random.default_rng(0).permutation(np.arange(16384) % len(pool))]
    fused_ln, tiles_of = packed.add_layer_norm, fused.segment_tiles

    def one_per_tile(lengths):
        return tuple((block, first, last, 1) for block, first, last, _ in tiles_of(lengths))

    def set_variant(name: str) -> None:
        packed.add_layer_norm = (lambda y, r, norm: norm(y + r)) if name in ("torch-ln", "both") else fused_ln
        fused.segment_tiles = one_per_tile if name in ("one-per-tile", "both") else tiles_of

    with tempfile.TemporaryDirectory() as tmp:
        enc = SentenceEncoder(str(g.random_model(arch, Path("tok"), Path(tmp) / arch)), pooling="mean", device="cuda")
        enc.encode(g.synthetic(Path("tok"), 20000), show_progress_bar=False)
        chunk = enc.prepare_chunk((0, text), enc.token_budget, None, pooled=False)
        plan, runner = enc._plan(None), enc._runner
        variants = ["main", "torch-ln", "one-per-tile", "both"]
        host = {v: [] for v in variants}
        device = {v: [] for v in variants}
        outputs = {}
        tiles = {}
        for r in range(rounds + 1):
            for v in variants:
                set_variant(v)
                torch.cuda.synchronize()
                t = time.perf_counter()
                pending = runner.launch(chunk, plan, None, None, False, None)
                spent = time.perf_counter() - t
                torch.cuda.synchronize()
                # Device time: the launches queue up behind a sleeping kernel, so the events time the work alone.
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(200_000_000)
                start.record()
                runner.launch(chunk, plan, None, None, False, None)
                end.record()
                torch.cuda.synchronize()
                if r == 0:  # the first round compiles and sets up what each variant needs: not timed
                    outputs[v] = pending.result.clone()
                    lengths = chunk.batches[0].buffer[chunk.batches[0].rows * chunk.batches[0].width :].numpy()
                    tiles[v] = len(fused.segment_tiles(lengths))
                    continue
                host[v].append(spent * 1e3)
                device[v].append(start.elapsed_time(end))
        set_variant("main")
        out = {"arch": arch, "card": g.card(), "batches": len(chunk.batches), "sentences": chunk.n, "rounds": rounds}
        for v in variants:
            diff = float((outputs[v] - outputs["main"]).abs().max())
            out[v] = {
                "host_ms_median": round(statistics.median(host[v]), 3),
                "host_ms_min": round(min(host[v]), 3),
                "device_ms_median": round(statistics.median(device[v]), 3),
                "tiles_first_batch": tiles[v],
                "max_abs_diff_vs_main": diff,
            }
        print(json.dumps(out))


if __name__ == "__main__":
    main()
