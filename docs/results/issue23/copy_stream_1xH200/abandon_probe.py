"""Why an abandoned iter_encode stream leaves its threads on the card host: Prefetcher.close calls, threads after
each close, and every thread's stack at the end."""
import sys, threading, time, faulthandler
sys.path.insert(0, "tests")
from pathlib import Path
import bertflow.encoding.batching as BT
from bertflow import SentenceEncoder
from conftest import SENTENCES, make_tiny_bert
orig = BT.Prefetcher.close
def close(self):
    t = time.perf_counter(); orig(self); print(f"  Prefetcher.close took {1e3*(time.perf_counter()-t):.1f} ms; threads {[x.name for x in threading.enumerate()]}", flush=True)
BT.Prefetcher.close = close
model = make_tiny_bert(Path("/tmp/abandon_tiny"))
enc = SentenceEncoder(str(model), device="cpu", tokenize_workers=2)
print("before", [x.name for x in threading.enumerate()], "pool", enc.chunk_tokenizer.pool, flush=True)
for i in range(3):
    it = enc.iter_encode(iter(SENTENCES * 50), chunk_size=4)
    next(it)
    print(f"iteration {i}: after next, threads {[x.name for x in threading.enumerate()]}", flush=True)
    it.close()
    print(f"iteration {i}: after it.close()", flush=True)
time.sleep(2)
print("end", [x.name for x in threading.enumerate()], flush=True)
faulthandler.dump_traceback(all_threads=True)
