"""Host time of a GEMM launch at a token count M never seen before in the process, against the same M again:
F.linear and torch._addmm_activation (GELU epilogue), MiniLM-L6 and BERT-base layer shapes, bf16, H200."""
import time, statistics, torch, torch.nn.functional as F
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
rng = torch.Generator().manual_seed(1)
shapes = {"minilm": [(384, 1152), (384, 384), (384, 1536), (1536, 384)], "bert": [(768, 2304), (768, 768), (768, 3072), (3072, 768)]}
tops = {"minilm": 262144, "bert": 65536}
for model, layer in shapes.items():
    top = tops[model]
    big = torch.randn(top + 4096, 3072, device=dev, dtype=dt)
    for K, N in layer:
        W = torch.randn(N, K, device=dev, dtype=dt); b = torch.randn(N, device=dev, dtype=dt)
        for op in ("linear", "gelu"):
            if op == "gelu" and N not in (1536, 3072):
                continue
            f = (lambda x: F.linear(x, W, b)) if op == "linear" else (lambda x: torch._addmm_activation(b, x, W.t(), use_gelu=True))
            f(big[:top // 2, :K]); torch.cuda.synchronize()
            first, again = [], []
            Ms = sorted({int(top * (0.2 + 0.8 * float(torch.rand(1, generator=rng)))) // 256 * 256 for _ in range(12)})
            for M in Ms:
                x = big[:M, :K]
                torch.cuda.synchronize(); t = time.perf_counter(); f(x); first.append(time.perf_counter() - t)
                torch.cuda.synchronize(); t = time.perf_counter(); f(x); again.append(time.perf_counter() - t)
                torch.cuda.synchronize()
            print(f"{model} {op} K={K} N={N}: new M host ms median {1e3*statistics.median(first):.2f} max {1e3*max(first):.2f}; "
                  f"same M again median {1e3*statistics.median(again):.3f} max {1e3*max(again):.3f}")
