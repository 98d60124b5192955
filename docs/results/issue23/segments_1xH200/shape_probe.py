"""Host time of a GEMM the first time its M is met vs again (cuBLAS / cuBLASLt per-shape set-up)."""
import statistics, time, torch, torch.nn.functional as F
torch.manual_seed(0)
dev = "cuda"
x = torch.randn(70000, 768, device=dev, dtype=torch.bfloat16)
w = torch.randn(3072, 768, device=dev, dtype=torch.bfloat16); b = torch.randn(3072, device=dev, dtype=torch.bfloat16)
def host(fn):
    torch.cuda.synchronize(); t = time.perf_counter(); fn(); h = time.perf_counter() - t; torch.cuda.synchronize(); return h
ops = {"linear": lambda M: F.linear(x[:M], w, b), "addmm_gelu": lambda M: torch._addmm_activation(b, x[:M], w.t(), use_gelu=True)}
for name, op in ops.items():
    op(1000); op(1000)
    first, again = [], []
    for M in range(40001, 40001 + 37 * 20, 37):
        first.append(host(lambda: op(M))); again.append(host(lambda: op(M)))
    print(name, "new M: median host ms %.3f max %.3f | same M again: median %.3f" % (1e3 * statistics.median(first), 1e3 * max(first), 1e3 * statistics.median(again)))
    b1 = [host(lambda M=M: op(M)) for M in range(50176, 50176 + 1024 * 10, 1024)]
    b2 = [host(lambda M=M: op(M)) for M in range(50176, 50176 + 1024 * 10, 1024)]
    print(name, "multiples of 1024, first %.3f again %.3f" % (1e3 * statistics.median(b1), 1e3 * statistics.median(b2)))
