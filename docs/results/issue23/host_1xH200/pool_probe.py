"""Host-side probe (no GPU): where does a 4,096-sentence chunk's tokenisation time go on this host?
In-process shortcut speed, TokenizerPool (ProcessPoolExecutor) latency, and a direct-pipe pool prototype."""
import faulthandler; faulthandler.dump_traceback_later(100, exit=True)
import multiprocessing, os, queue, statistics, sys, threading, time, itertools
from pathlib import Path
import numpy as np
from tokenizers import Tokenizer
sys.path.insert(0, str(next(d for d in Path(__file__).resolve().parents if (d / "benchmarks").is_dir()) / "benchmarks"))
from gpu_checks import sts_pool
from bertflow.encoding import tokenization as T

G = Path(__file__).parent  # tok/ and sts/ beside this file (the session carried them in .speed/gpu)
tok = Tokenizer.from_file(str(G / "tok/tokenizer.json")); tok.no_padding(); tok.enable_truncation(64)
pool = sts_pool(G / "sts")
rng = np.random.default_rng(0)
text = [pool[i] for i in rng.permutation(np.arange(40000) % len(pool))]
P = int(sys.argv[1]) if len(sys.argv) > 1 else 8
print("sentences", len(pool), "cpus", os.cpu_count(), "processes", P)

sc = T.WordPieceShortcut.from_tokenizer(tok)
ms = lambda t: round((time.perf_counter() - t) * 1e3, 2)
r = []
for i in range(6):
    part = text[i * 512:(i + 1) * 512]
    t = time.perf_counter(); T.tokenize_arrays(tok, part, sc); a = ms(t)
    t = time.perf_counter(); T.tokenize_arrays(tok, part, sc); r.append((a, ms(t)))
print("in-process 512 (new, again) ms", r)

_W = None
def _loop(conn, js):
    global _W
    T._init_worker(js)
    while True:
        item = conn.recv()
        if item is None:
            return
        r = T._worker_tokenize(item)
        conn.send(r)

class PipePool:
    def __init__(self, js, n):
        ctx = multiprocessing.get_context("fork")
        self.idle = queue.SimpleQueue(); self.procs = []
        for _ in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_loop, args=(b, js), daemon=True); p.start(); self.procs.append(p)
            self.idle.put(a)
        self.n = n; self.lock = threading.Lock()
    def tokenize(self, sentences):
        n = len(sentences); parts = max(1, min(self.n, n // T.MIN_PART))
        bounds = np.linspace(0, n, parts + 1).astype(np.int64).tolist()
        used = []
        with self.lock:  # one caller takes its workers at a time: two callers each holding some would deadlock
            for a, b in itertools.pairwise(bounds):
                c = self.idle.get(); c.send(list(sentences[a:b])); used.append(c)
        out = []
        for c in used:
            out.append(c.recv()); self.idle.put(c)
        return T.TokenArrays.concatenate(out)

def bench(name, p, base):
    rows = []
    for i in range(5):
        chunk = text[base + i * 4096: base + (i + 1) * 4096]
        t = time.perf_counter(); x = p.tokenize(chunk); a = ms(t)
        t = time.perf_counter(); y = p.tokenize(chunk); b = ms(t)
        t = time.perf_counter(); p.tokenize(chunk[:2]); c = ms(t)
        assert np.array_equal(x.ids, y.ids)
        rows.append((a, b, c))
    # two threads at once, as the two preparing threads do (4,096 and 8,192 new sentences)
    res = {}
    def job(k, s):
        t = time.perf_counter(); p.tokenize(s); res[k] = ms(t)
    th = [threading.Thread(target=job, args=("4096", text[base + 20480: base + 24576])),
          threading.Thread(target=job, args=("8192", text[base + 24576: base + 32768]))]
    for t_ in th: t_.start()
    for t_ in th: t_.join()
    print(name, "4096 (new, again, 2 sentences) ms", rows, "concurrent", res)
    return x

pp = T.TokenizerPool(tok.to_str(), P) if "pipe" not in sys.argv else None
x1 = bench("TokenizerPool", pp, 0) if pp else None
pp and pp.close()
qq = PipePool(tok.to_str(), P)
x2 = bench("PipePool     ", qq, 0)
assert x1 is None or np.array_equal(x1.ids, x2.ids)
sys.setswitchinterval(0.0005)
bench("PipePool si=0.5ms", qq, 0)
pp = T.TokenizerPool(tok.to_str(), P)
bench("TokenizerPool si=0.5ms", pp, 0)
sys.setswitchinterval(0.005)
bench("TokenizerPool again", pp, 0)
bench("PipePool again", qq, 0)
