"""Where a first pass's time goes after tokenisation: main-thread launch/finish intervals, prepare (tokenise + pack)
intervals on the prefetch threads, device busy intervals from CUDA events around each chunk's launch, and the CUDA
allocator's counters per pass. MiniLM-L6 (or argv[1]) random weights, default settings, 40,000 STS sentences after
the gpu_checks warm-up (20,000 synthetic sentences): passes 0 (first), 1, 2 over the same text."""
import os, sys, time, faulthandler
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, str(next(d for d in Path(__file__).resolve().parents if (d / "benchmarks").is_dir()) / "benchmarks"))
from gpu_checks import random_model, sts_pool, synthetic
from bertflow import SentenceEncoder

G = Path(__file__).parent
arch = sys.argv[1] if len(sys.argv) > 1 else "minilm-l6"
model = random_model(arch, G / "tok", Path(f"/tmp/pprobe_{arch}"))
pool = sts_pool(G / "sts"); rng = np.random.default_rng(0)
text = [pool[i] for i in rng.permutation(np.arange(40000) % len(pool))]
enc = SentenceEncoder(str(model), pooling="mean", device="cuda")
enc.encode(synthetic(G / "tok", int(os.environ.get("PROBE_WARM", "20000"))), show_progress_bar=False)
torch.cuda.synchronize()
R = enc._runner
import bertflow.encoding.forward as FW
pinned = []  # (t0, t1, rows) of each pinned allocation in launch
class _Torch:
    def __getattr__(self, name): return getattr(torch, name)
    def empty(self, *shape, **kw):
        if not kw.get("pin_memory"):
            return torch.empty(*shape, **kw)
        size = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        t0 = time.perf_counter()
        if os.environ.get("PROBE_PIN_TOP") and len(size) == 2:  # one size class for every chunk's output
            out = torch.empty((max(size[0], 65536), size[1]), **kw)[: size[0]]
        else:
            out = torch.empty(size, **kw)
        pinned.append((t0, time.perf_counter(), size)); return out
FW.torch = _Torch()
ev = []  # (kind, t0, t1, info)
orig_launch, orig_finish, orig_prep, orig_tok = R.launch, R.finish, enc.prepare_chunk, enc.chunk_tokenizer.tokenize
cuda_marks = []
def launch(chunk, *a, **k):
    faulthandler.cancel_dump_traceback_later()
    s = torch.cuda.Event(enable_timing=True); s.record()
    d0 = torch.cuda.memory_stats().get("num_device_alloc", 0); pinned.clear()
    t0 = time.perf_counter(); out = orig_launch(chunk, *a, **k); t1 = time.perf_counter()
    d1 = torch.cuda.memory_stats().get("num_device_alloc", 0)
    pins = [(round(1e3 * (b - a_), 2), sz) for a_, b, sz in pinned]
    e = torch.cuda.Event(enable_timing=True); e.record()
    toks = [int(b.rows * b.width) for b in chunk.batches]
    cuda_marks.append((s, e)); ev.append(("launch", t0, t1, f"n={chunk.n} batches={len(chunk.batches)} padded_tokens={toks} device_allocs={d1 - d0} pinned_ms={pins}"))
    return out
def finish(p, *a):
    faulthandler.cancel_dump_traceback_later()
    t0 = time.perf_counter(); out = orig_finish(p, *a); ev.append(("finish", t0, time.perf_counter(), ""))
    faulthandler.dump_traceback_later(0.3)  # a stall of the main thread before its next launch/finish: all stacks
    return out
def prep(*a, **k):
    t0 = time.perf_counter(); out = orig_prep(*a, **k); ev.append(("prepare", t0, time.perf_counter(), f"n={out.n}")); return out
def tok(s, *a, **k):
    t0 = time.perf_counter(); out = orig_tok(s, *a, **k); ev.append(("tokenize", t0, time.perf_counter(), f"n={len(s)}")); return out
R.launch, R.finish, enc.prepare_chunk, enc.chunk_tokenizer.tokenize = launch, finish, prep, tok
keys = ("num_device_alloc", "num_device_free", "num_alloc_retries", "segment.all.allocated", "num_sync_all_streams")
for p in range(int(os.environ.get("PROBE_PASSES", "3"))):
    ev.clear(); cuda_marks.clear()
    m0 = torch.cuda.memory_stats()
    torch.cuda.synchronize(); start = time.perf_counter()
    enc.encode(text, show_progress_bar=False)
    faulthandler.cancel_dump_traceback_later()
    torch.cuda.synchronize(); wall = time.perf_counter() - start
    m1 = torch.cuda.memory_stats()
    print(f"pass {p}: {len(text)/wall:,.0f} sentences/s, wall {wall*1e3:.1f} ms; allocator deltas",
          {k.split('.')[0] if k.startswith('segment') else k: m1.get(k, 0) - m0.get(k, 0) for k in keys})
    for kind, t0, t1, info in sorted(ev, key=lambda e: e[1]):
        print(f"  {kind:8s} {1e3*(t0-start):7.1f} -> {1e3*(t1-start):7.1f} ms ({1e3*(t1-t0):5.1f}) {info}")
    base = cuda_marks[0][0]
    print("  device per launch (ms from first launch's start event):",
          [(round(base.elapsed_time(s), 1), round(base.elapsed_time(e), 1)) for s, e in cuda_marks])
