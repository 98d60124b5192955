"""Exploration for issue 17 item 1: does ``torch.compile`` of the model lift BERT-base encoding on one GPU?

Route tried: the bertflow encoder unchanged (its length-sorted token-budget batches, bf16, SDPA without cuDNN),
with its Hugging Face model replaced by ``torch.compile(model, dynamic=True)``, so that one compiled graph with
symbolic (rows, width) serves every batch shape, and Inductor fuses the elementwise work around the matrix
products (bias + GELU, residual + LayerNorm) that the eager model runs as separate kernels. Not in the package.

Reported, side by side in one process on a random-weight BERT-base (speed does not depend on the weights):
sentences/s of ``SentenceEncoder.encode`` eager and compiled on STS sentences (alternating rounds, medians), the
time of the first compiled pass (compilation included), the bare forward on one large batch (MFU against the
H100's 989 TFLOP/s dense bf16), and the largest cosine deviation between the two encoders' vectors.

    python benchmarks/bert_compile_gpu.py --tokenizer-dir TOK --data-dir STS
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import (
    H100_BF16_PEAK,
    build_random_model,
    environment,
    interleave,
    model_flops,
    replicate,
    sts_sentences,
)

from bertflow.encoding.encoder import SentenceEncoder


def bare_forward(model: Any, rows: int, width: int, reps: int = 20) -> float:
    """Seconds per forward of ``model`` on one [rows, width] batch without padding (CUDA events, after warm-up)."""
    ids = torch.randint(1000, 20000, (rows, width), device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            model(input_ids=ids)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            model(input_ids=ids)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


#: Kernel-name fragments -> kind, first match wins (cuBLAS / CUTLASS names on Hopper, SDPA's kernels).
_KINDS = (
    (("flash", "fmha", "attention", "attn", "sdpa"), "attention"),  # before "sm90": cuDNN's SDPA names hold both
    (("gemm", "xmma", "cutlass", "nvjet", "sm90"), "matrix products"),
    (("layer_norm", "layernorm"), "layer norm"),
    (("gelu",), "gelu"),
)


def profile(model: Any, rows: int, width: int) -> dict[str, Any]:
    """GPU time of one eager forward by kernel kind (torch.profiler), and the 12 costliest kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    ids = torch.randint(1000, 20000, (rows, width), device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            model(input_ids=ids)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                model(input_ids=ids)
            torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / 5 / 1e3  # ms per forward
    total = sum(kernels.values())
    kinds: dict[str, float] = {}
    for name, ms in kernels.items():
        low = name.lower()
        kind = next((k for frags, k in _KINDS if any(f in low for f in frags)), "other (elementwise, copies)")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    print(f"[profile] eager forward {rows}x{width}: {total:.2f} ms of kernels", flush=True)
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:30s} {ms:7.2f} ms  {100 * ms / total:5.1f}%")
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    for name, ms in top:
        print(f"  {ms:7.2f} ms  {name[:110]}")
    return {"total_ms": total, "kinds_ms": kinds, "top_kernels_ms": dict(top)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--sentences", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", default=None, help="torch.compile mode (default: Inductor's default)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-encode", action="store_true", help="only the bare-forward parts")
    parser.add_argument(
        "--static", default="", help="shapes RxW,RxW: bare forward compiled for each fixed shape (dynamic=False)"
    )
    parser.add_argument("--profile", action="store_true", help="eager forward at 4096x16: GPU time by kernel kind")
    args = parser.parse_args()

    torch._dynamo.config.recompile_limit = 64  # a silent fall-back to eager after 8 shapes would hide the result
    env = environment("cuda")
    print(f"[env] {json.dumps(env)}", flush=True)
    sentences = replicate(sts_sentences(args.data_dir), args.sentences)
    out: dict[str, Any] = {"environment": env, "sentences": len(sentences), "mode": args.mode}
    with tempfile.TemporaryDirectory(prefix="bertflow-compile-") as tmp:
        path = str(build_random_model("bert-base", args.tokenizer_dir, Path(tmp) / "bert-base"))
        eager = SentenceEncoder(path, pooling="mean", device="cuda", max_length=64)
        compiled = SentenceEncoder(path, pooling="mean", device="cuda", max_length=64)
        compiled.model = torch.compile(compiled.model, dynamic=True, mode=args.mode)
        lengths = np.asarray([len(x) for x in eager.tokenize(sentences)])
        flops = model_flops(eager.model.config, lengths)
        out["real_tokens_per_sentence"] = float(lengths.mean())

        if not args.skip_encode:
            t0 = time.perf_counter()
            b = compiled.encode(sentences)
            out["first_compiled_pass_s"] = time.perf_counter() - t0
            print(
                f"[compile] first compiled pass (compilation included) {out['first_compiled_pass_s']:.1f} s", flush=True
            )
            a = eager.encode(sentences)
            compiled.encode(sentences)  # shapes the first pass may have recompiled for
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            cos = (a64 * b64).sum(1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)
            out["min_cosine_compiled_vs_eager"] = float(cos.min())
            out["max_cosine_deviation"] = float(1 - cos.min())

            times = interleave(
                {"eager": lambda: eager.encode(sentences), "compiled": lambda: compiled.encode(sentences)}, args.rounds
            )
            for name, ts in times.items():
                t = float(np.median(ts))
                out[name] = {"seconds": ts, "sentences_per_s": len(sentences) / t, "mfu": flops / t / H100_BF16_PEAK}
            out["compiled / eager"] = out["compiled"]["sentences_per_s"] / out["eager"]["sentences_per_s"]
            out["padded_tokens_eager"] = eager.last_stats.padded_tokens

        forward = {}
        for rows, width in ((4096, 16), (2048, 32)):
            tok_flops = model_flops(eager.model.config, np.full(rows, width))
            for name, enc in (("eager", eager), ("compiled", compiled))[: 1 if args.skip_encode else 2]:
                s = bare_forward(enc.model, rows, width)
                forward[f"{name} {rows}x{width}"] = {"ms": 1e3 * s, "mfu": tok_flops / s / H100_BF16_PEAK}
        for shape in filter(None, args.static.split(",")):
            rows, width = (int(v) for v in shape.split("x"))
            tok_flops = model_flops(eager.model.config, np.full(rows, width))
            static = torch.compile(eager.model, dynamic=False, mode=args.mode)
            t0 = time.perf_counter()
            bare_forward(static, rows, width, reps=1)
            compile_s = time.perf_counter() - t0
            s = bare_forward(static, rows, width)
            forward[f"static {rows}x{width}"] = {
                "ms": 1e3 * s,
                "mfu": tok_flops / s / H100_BF16_PEAK,
                "compile_s": compile_s,
            }
            print(f"[static] {shape}: {1e3 * s:.2f} ms (compile {compile_s:.0f} s)", flush=True)
        out["bare_forward"] = forward
        if args.profile:
            out["profile"] = profile(eager.model, 4096, 16)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(
        f"\ncard: {env.get('gpu')}; BERT-base bf16 (random weights), {len(sentences)} STS sentences, "
        f"{out['real_tokens_per_sentence']:.1f} tokens each, max_length 64, medians of {args.rounds} rounds"
    )
    for name in ("eager", "compiled") if not args.skip_encode else ():
        print(f"  {name:9s} {out[name]['sentences_per_s']:>10,.0f} sent/s  MFU {100 * out[name]['mfu']:.1f}%")
    if not args.skip_encode:
        print(
            f"  compiled / eager {out['compiled / eager']:.3f}x; max cosine deviation {out['max_cosine_deviation']:.2e}"
        )
    for k, v in forward.items():
        print(f"  bare forward {k:20s} {v['ms']:7.2f} ms  MFU {100 * v['mfu']:.1f}%")


if __name__ == "__main__":
    main()
