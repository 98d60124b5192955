"""Where a chunk's tokenisation time goes inside the encode pipeline: parent-side round trip of each
ChunkTokenizer.tokenize call against the workers' own start/end times (perf_counter is CLOCK_MONOTONIC, shared by
processes). MiniLM-L6 random weights, default settings, 40,000 STS sentences: first pass then 2 warm passes."""
import os, sys, time, glob
from pathlib import Path
import numpy as np
sys.path.insert(0, str(next(d for d in Path(__file__).resolve().parents if (d / "benchmarks").is_dir()) / "benchmarks"))
from gpu_checks import random_model, sts_pool, synthetic
import bertflow.encoding.tokenization as T

G = Path(__file__).parent  # tok/ and sts/ beside this file (the session carried them in .speed/gpu)
LOG = "/tmp/wprobe"
os.makedirs(LOG, exist_ok=True)
for f in glob.glob(LOG + "/*"): os.remove(f)
_orig = T._worker_tokenize
_fh = {}
def _timed(sentences):
    t0 = time.perf_counter(); out = _orig(sentences); t1 = time.perf_counter()
    fh = _fh.get("f") or _fh.setdefault("f", open(f"{LOG}/{os.getpid()}", "a", buffering=1))
    fh.write(f"{t0} {t1} {len(sentences)}\n")
    return out
T._worker_tokenize = _timed

from bertflow import SentenceEncoder
arch = sys.argv[1] if len(sys.argv) > 1 else "minilm-l6"
model = random_model(arch, G / "tok", Path("/tmp/wprobe_model"))
pool = sts_pool(G / "sts"); rng = np.random.default_rng(0)
text = [pool[i] for i in rng.permutation(np.arange(40000) % len(pool))]
from bertflow.encoding.settings import EncodeSettings
dev = os.environ.get("PROBE_DEVICE", "cuda")
enc = SentenceEncoder(str(model), pooling="mean", device=dev, settings=EncodeSettings(tokenize_processes=None if dev == "cuda" else 2))
N = int(os.environ.get("PROBE_N", "40000")); text = text[:N]
enc.encode(synthetic(G / "tok", min(N, 20000)), show_progress_bar=False)
calls = []
orig_tok = enc.chunk_tokenizer.tokenize
def tok(sentences, *a, **k):
    t0 = time.perf_counter(); out = orig_tok(sentences, *a, **k); calls.append((t0, time.perf_counter(), len(sentences))); return out
enc.chunk_tokenizer.tokenize = tok
def worker_events():
    ev = []
    for f in glob.glob(LOG + "/*"):
        for line in open(f):
            a, b, n = line.split(); ev.append((float(a), float(b), int(n), os.path.basename(f)))
    return ev
for p in range(int(os.environ.get("PROBE_PASSES", "3"))):
    calls.clear(); start = time.perf_counter()
    enc.encode(text, show_progress_bar=False)
    wall = time.perf_counter() - start
    ev = [e for e in worker_events() if e[0] >= start]
    print(f"pass {p}: {len(text)/wall:,.0f} sentences/s, wall {wall*1e3:.1f} ms")
    for t0, t1, n in calls:
        P = enc.chunk_tokenizer.pool.processes if enc.chunk_tokenizer.pool else 1
        parts = max(1, min(P, n // T.MIN_PART)); sizes = set(np.diff(np.linspace(0, n, parts + 1).astype(np.int64)).tolist())
        mine = sorted(e for e in ev if t0 <= e[0] <= t1 and e[2] in sizes)
        starts = [round((e[0] - t0) * 1e3, 1) for e in mine]
        durs = [round((e[1] - e[0]) * 1e3, 1) for e in mine]
        back = round((t1 - max(e[1] for e in mine)) * 1e3, 1) if mine else None
        print(f"  call n={n} at {1e3*(t0-start):.1f} ms took {1e3*(t1-t0):.1f} ms; worker starts {starts} durations {durs} last end -> back {back} ms")
