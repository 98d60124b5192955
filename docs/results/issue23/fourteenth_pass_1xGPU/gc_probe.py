"""How long Python's collections take in a process holding torch, transformers and a loaded encoder (issue 23,
fourteenth pass: the first suspect for a main thread's slow pass). Prints the tracked objects and each generation's
collection time, then a full collection's after ``gc.freeze()``:

    PYTHONPATH=src python docs/results/issue23/fourteenth_pass_1xGPU/gc_probe.py MODEL_DIR
"""

import gc
import sys
import time

from bertflow import SentenceEncoder

enc = SentenceEncoder(sys.argv[1], pooling="mean")
enc.encode(["a warm up sentence"] * 100)
print("objects", len(gc.get_objects()), "counts", gc.get_count(), "thresholds", gc.get_threshold())
for gen in (0, 1, 2):
    t = time.perf_counter()
    gc.collect(gen)
    print("collect", gen, round((time.perf_counter() - t) * 1e3, 2), "ms")
gc.freeze()
t = time.perf_counter()
gc.collect(2)
print("after freeze collect 2", round((time.perf_counter() - t) * 1e3, 2), "ms")
