"""Issue 23, eleventh pass: where a first pass's time goes, sampled. Run under py-spy (``record --format speedscope
--idle --threads --native``) from the folder that holds ``tok/`` and ``sts/`` (as ``.speed/gpu`` does):

    python spy_probe.py ARCH [blocking]        # one process: warm-up, then passes separated by 0.3 s sleeps
    python spy_probe.py --summary PROFILE.json # per pass: the main thread's samples by what it was doing

``blocking``: the device's primary context schedules host waits by blocking (CU_CTX_SCHED_BLOCKING_SYNC) instead of
CUDA's default (spinning while fewer contexts than cores): a spinning wait is CPU time, so the main thread's CPU
counters cannot tell waiting for the device from work; under blocking sync they can.
"""

from __future__ import annotations

import collections
import ctypes
import gzip
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSES = 4
#: What the main thread was doing, by the innermost frame of ours on its stack (first match wins).
#: A frame is "name file", matched by (function name, end of its file's path).
PLACES = [
    ("sleep between passes", [("run", "spy_probe.py")], "time.sleep"),
    ("wait for a prepared chunk", [("__iter__", "encoding/batching.py")], None),
    ("finish: copy out, wait for the device", [("finish", "encoding/forward.py")], None),
    ("launch: a chunk's forward", [("launch", "encoding/forward.py")], None),
]


def run(arch: str, blocking: bool, device: str = "cuda", n: int = 40000) -> None:
    if blocking:
        cuda = ctypes.CDLL("libcuda.so.1")
        assert cuda.cuInit(0) == 0
        assert cuda.cuDevicePrimaryCtxSetFlags(0, 4) == 0  # CU_CTX_SCHED_BLOCKING_SYNC
    sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]
    import tempfile

    import gpu_checks as g
    import torch

    from bertflow import SentenceEncoder

    tok, sts = Path("tok"), Path("sts")
    pool = g.sts_pool(sts)
    rng = __import__("numpy").random.default_rng(0)
    text = [pool[i] for i in rng.permutation(__import__("numpy").arange(n) % len(pool))]
    with tempfile.TemporaryDirectory() as tmp:
        enc = SentenceEncoder(str(g.random_model(arch, tok, Path(tmp) / arch)), pooling="mean", device=device)
        enc.encode(g.synthetic(tok, 20000 if device == "cuda" else 200), show_progress_bar=False)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        rates, main_cpu = [], []
        for _ in range(PASSES):
            sync()
            time.sleep(0.3)
            t, c = time.perf_counter(), time.thread_time()
            enc.encode(text, show_progress_bar=False)
            sync()
            rates.append(round(len(text) / (time.perf_counter() - t)))
            main_cpu.append(round(time.thread_time() - c, 4))
        time.sleep(0.3)
        print(json.dumps({"arch": arch, "blocking": blocking, "rates": rates, "main_cpu_s": main_cpu}))


def place(stack: list[tuple[str, str]]) -> str:
    """The innermost of :data:`PLACES` on ``stack`` (outermost frame first); a sleep is a ``run`` frame whose
    next frame is not ours (py-spy shows the C sleep as a native frame or nothing)."""
    for name, keys, _ in PLACES[1:]:
        if any((fn == k or fn.endswith("." + k)) and file.endswith(suffix) for fn, file in stack for k, suffix in keys):
            return name
    inner = [fn for fn, file in stack if file.endswith("spy_probe.py")]
    if inner and inner[-1] == "run" and not any("bertflow" in file or "torch" in file for _, file in stack):
        return PLACES[0][0]
    return "other: " + (" <- ".join(f"{fn}" for fn, _ in stack[::-1][:4]) if stack else "?")


def summary(path: Path) -> None:
    d = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    frames = [(f["name"], f.get("file") or "") for f in d["shared"]["frames"]]
    where = [f"{f['name']}:{f.get('line', '')}" for f in d["shared"]["frames"]]
    main = max(d["profiles"], key=lambda p: len(p["samples"]))  # it lives longest: the most samples
    for prof in [main]:
        stacks = [[frames[i] for i in s] for s in prof["samples"]]
        lines = [[where[i] for i in s] for s in prof["samples"]]
        weights = prof["weights"]
        # Passes are the runs of samples between the sleeps: at least 0.1 s in a row on a time.sleep line of run().
        asleep = [place(st) == PLACES[0][0] and ln[-1].startswith("run:") for st, ln in zip(stacks, lines, strict=True)]
        passes, current, run_start = [], [], None
        for i, (stack, line, w) in enumerate(zip(stacks, lines, weights, strict=True)):
            if asleep[i]:
                run_start = i if run_start is None else run_start
                continue
            if run_start is not None and sum(weights[run_start:i]) >= 0.1 and current:
                passes.append(current)
                current = []
            run_start = None
            current.append((stack, line, w))
        # (what follows the last sleep is the process's exit)
        passes = passes[-PASSES:]  # the model load and warm-up come before
        for k, samples in enumerate(passes):
            total = sum(w for *_, w in samples)
            by_place = collections.Counter()
            leaves = collections.Counter()
            for stack, line, w in samples:
                by_place[place(stack)] += w
                # the innermost frame of bertflow's and the leaf: which line of ours waits in which call
                ours = [x for x, (_, file) in zip(line, stack, strict=True) if "bertflow" in file]
                leaves[f"{ours[-1] if ours else '-'} > {line[-1] if line else '?'}"] += w
            print(f"pass {k + 1}: {total * 1e3:.0f} ms of main-thread samples")
            for name, w in by_place.most_common(8):
                print(f"  {w * 1e3:7.1f} ms  {name[:110]}")
            for n, w in leaves.most_common(10):
                print(f"    {w * 1e3:7.1f} ms  at {n[:120]}")
    # The other threads (the pipeline's: new ones each encode): samples by line, over the whole run.
    others = collections.Counter()
    for prof in d["profiles"]:
        if prof is main:
            continue
        for s in prof["samples"]:
            line = [where[i] for i in s]
            others[
                f"{prof['name'].split(chr(34))[1] if chr(34) in prof['name'] else '?'}: {line[-1] if line else '?'}"
            ] += 1
    print("other threads, samples by thread name and leaf (whole run, idle included):")
    for n, c in others.most_common(15):
        print(f"  {c:7d}  {n[:120]}")


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(Path(sys.argv[2]))
    else:
        mode = sys.argv[2] if len(sys.argv) > 2 else ""
        run(sys.argv[1], mode == "blocking", "cpu" if mode == "cpu" else "cuda", 2000 if mode == "cpu" else 40000)
