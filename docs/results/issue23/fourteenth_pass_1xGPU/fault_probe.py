"""What writing a fresh result array costs against writing it again (issue 23, fourteenth pass): a 40,000 x 384
float32 array (MiniLM-L6's result for one pass) written by ``torch.Tensor.copy_``, three times, with the process's
minor page faults; then whether numpy's ``fill`` lets the main thread run while another thread faults the pages in.

    python docs/results/issue23/fourteenth_pass_1xGPU/fault_probe.py
"""

import resource
import threading
import time

import numpy as np
import torch

source = torch.randn(40000, 384)
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    out = np.empty((40000, 384), np.float32)
    torch.from_numpy(out).copy_(source)
    first = time.perf_counter() - t
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    t = time.perf_counter()
    torch.from_numpy(out).copy_(source)
    again = time.perf_counter() - t
    print(f"fresh array written in {first * 1e3:.1f} ms ({faults} minor faults), written again in {again * 1e3:.1f} ms")
    del out


def spin(seconds: float) -> int:
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        n += 1
    return n


alone = spin(0.1)
fresh = np.empty((40000, 384), np.float32)
thread = threading.Thread(target=fresh.fill, args=(0.0,))
thread.start()
beside = spin(0.1)
thread.join()
print(f"main thread's loop: {beside} turns beside a fill on another thread, {alone} alone")
