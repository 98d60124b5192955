import os, time, sys
import torch
from bertflow.encoding.fused import slot_attention
print("HOME", os.environ.get("HOME"), "TRITON_CACHE_DIR", os.environ.get("TRITON_CACHE_DIR"), flush=True)
for D in (32, 64):
    for width in (16, 32, 64, 128):
        for aligned in (True, False):
            q = torch.randn(width * 8, 3, 12, D, device="cuda", dtype=torch.bfloat16)
            lengths = torch.full((9,), width, dtype=torch.int32, device="cuda")
            L = lengths[:8] if aligned else lengths[1:]
            torch.cuda.synchronize(); t = time.perf_counter()
            slot_attention(*q.unbind(1), L, width); torch.cuda.synchronize()
            t1 = time.perf_counter() - t
            t = time.perf_counter(); slot_attention(*q.unbind(1), L, width); torch.cuda.synchronize()
            print(sys.argv[1], D, width, aligned, round(t1, 3), round(time.perf_counter() - t, 5), flush=True)
