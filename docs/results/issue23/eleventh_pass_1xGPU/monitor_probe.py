"""Issue 23, eleventh pass: is a slow pass slow because the host's cores ran slower at that moment? Call a found
that in the slowest warm passes every tokeniser worker spent about twice its usual CPU time on the same work, with
no time stolen by the hypervisor. Here a separate process repeats a fixed piece of single-threaded Python work (a
"ruler", 0.4-0.5 ms on an idle core) for as long as the encoding processes run, and records how long each
repetition took; each pass's rate is then set beside the ruler's median during that pass (the clocks are the same:
CLOCK_MONOTONIC).

    python monitor_probe.py ruler OUT.json SECONDS   # the ruler, stopped after SECONDS
    python monitor_probe.py passes ARCH               # gpu_checks.throughput's setting, pass windows printed
    python monitor_probe.py report RULER.json PASSES.jsonl  # also call_d/ruler_bins.json call_d/passes.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ruler(out: Path, seconds: float) -> None:
    marks = []
    end = time.perf_counter() + seconds
    while (t := time.perf_counter()) < end:
        s = 0
        for i in range(10000):
            s += i * i
        marks.append((t, time.perf_counter() - t))
    out.write_text(json.dumps(marks))


def passes(arch: str) -> None:
    sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]
    import tempfile

    import gpu_checks as g
    import numpy as np
    import torch

    from bertflow import SentenceEncoder

    pool = g.sts_pool(Path("sts"))
    text = [pool[i] for i in np.random.default_rng(0).permutation(np.arange(40000) % len(pool))]
    with tempfile.TemporaryDirectory() as tmp:
        enc = SentenceEncoder(str(g.random_model(arch, Path("tok"), Path(tmp) / arch)), pooling="mean", device="cuda")
        enc.encode(g.synthetic(Path("tok"), 20000), show_progress_bar=False)
        for k in range(4):
            torch.cuda.synchronize()
            before = g.cpu_counters(enc)
            t = time.perf_counter()
            enc.encode(text, show_progress_bar=False)
            torch.cuda.synchronize()
            end = time.perf_counter()
            c = g.counter_deltas(before, g.cpu_counters(enc))
            print(
                json.dumps(
                    {
                        "arch": arch,
                        "pass": k + 1,
                        "start": t,
                        "end": end,
                        "rate": round(len(text) / (end - t)),
                        "worker_cpu_s": c["worker_cpu_s"],
                        "main_cpu_s": c["main_cpu_s"],
                    }
                )
            )


def report(ruler_file: Path, passes_file: Path) -> None:
    marks = json.loads(ruler_file.read_text())
    if isinstance(marks, dict):  # the record's binned copy (call_d/ruler_bins.json): each bin's median as one mark
        marks = [(t, dt) for t, dt, _ in marks["bins"]]
    typical = statistics.median(dt for _, dt in marks)
    print(f"ruler: {len(marks)} repetitions, median {typical * 1e3:.3f} ms")
    for line in passes_file.read_text().splitlines():
        p = json.loads(line)
        inside = [dt for t, dt in marks if p["start"] <= t <= p["end"]]
        slow = statistics.median(inside) / typical if inside else float("nan")
        print(
            f"{p['arch']:>9} pass {p['pass']}: {p['rate'] / 1e3:6.1f}k  workers {p['worker_cpu_s']:.2f} s  "
            f"main {p['main_cpu_s']:.3f} s  ruler x{slow:.2f} "
            f"(n={len(inside)}, max x{max(inside, default=0) / typical:.1f})"
        )


if __name__ == "__main__":
    if sys.argv[1] == "ruler":
        ruler(Path(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1] == "passes":
        passes(sys.argv[2])
    else:
        report(Path(sys.argv[2]), Path(sys.argv[3]))
