"""Why a process's first encode is slower than its later ones, and what paying the one-time costs at load buys
(issue 23, goals 1 and 2).

``variants``
    One fresh process per architecture and ``--variants`` entry, ``+``-joined steps: ``FIELD=VALUE`` (an
    ``EncodeSettings`` field set when the encoder is made: 0/1 for a flag, e.g. ``warm_up=1``, else an int,
    e.g. ``first_chunk=16384``),
    then, after the load, ``base`` (nothing), ``warmup`` (:func:`bertflow.encoding.warmup.warm_up`), ``reserve``
    (one large CUDA allocation, freed: the caching allocator keeps it), ``synthN`` (``encode`` of N synthetic
    token-id sentences of every length), ``eager`` (``CUDA_MODULE_LOADING=EAGER``).
    Then ``gpu_checks.py throughput``'s protocol: an encode of 20,000 random-word sentences (the process's first
    encode), a first pass over 40,000 STS sentences, ``--rounds`` warm passes. Reported per process: load
    seconds, step seconds, the first encode's seconds, the first and warm passes, CUDA segments and pinned host
    allocations made during the first STS pass.
``graphs``
    The unpadded forward (``PackedBert.states``, slotted attention, CUDA kernels) of one batch of ~65,536 token
    slots per width, eager vs replayed from a CUDA graph: host seconds to queue, device seconds, capture seconds,
    and the largest 1 - cos between the two outputs' token vectors.

    PYTHONPATH=src:benchmarks python3 benchmarks/first_pass_gpu.py variants --tokenizer-dir TOK --data-dir STS
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode_profile_gpu import _counters  # noqa: E402
from gpu_checks import random_model, sts_pool, synthetic  # noqa: E402


def child(args: argparse.Namespace) -> dict[str, Any]:
    begin = time.perf_counter()
    from bertflow import SentenceEncoder
    from bertflow.encoding.warmup import synthetic_tokens, warm_up

    pool = sts_pool(args.data_dir)
    rng = np.random.default_rng(0)
    text = [pool[i] for i in rng.permutation(np.arange(args.sentences) % len(pool))]
    warm_text = synthetic(args.tokenizer_dir, 20000)
    torch.cuda.init()
    torch.cuda.synchronize()
    ready = time.perf_counter() - begin
    t = time.perf_counter()
    fields = dict(step.split("=") for step in args.variant.split("+") if "=" in step)
    kwargs = {}
    if fields:
        from bertflow.encoding.settings import EncodeSettings

        flags = {f.name for f in dataclasses.fields(EncodeSettings) if isinstance(f.default, bool)}
        kwargs["settings"] = EncodeSettings(**{k: bool(int(v)) if k in flags else int(v) for k, v in fields.items()})
    enc = SentenceEncoder(str(args.model), pooling="mean", device="cuda", **kwargs)
    torch.cuda.synchronize()
    out: dict[str, Any] = {"arch": args.arch, "variant": args.variant, "load_s": time.perf_counter() - t}
    out["imports_and_text_s"] = ready
    steps = {}
    for step in args.variant.split("+"):
        if "=" in step:
            continue
        t = time.perf_counter()
        if step == "warmup":
            warm_up(enc)
        elif step == "reserve":
            block = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
            del block
        elif step.startswith("synth"):
            tokens = synthetic_tokens(int(step[5:]), enc.max_length, enc.vocab_size, seed=3)
            enc.encode(tokens, show_progress_bar=False)
        torch.cuda.synchronize()
        steps[step] = time.perf_counter() - t
    out["steps_s"] = steps
    t = time.perf_counter()
    enc.encode(warm_text, show_progress_bar=False)
    torch.cuda.synchronize()
    out["first_encode_s"] = time.perf_counter() - t
    rates, counts = [], []
    for _ in range(1 + args.rounds):
        before = _counters()
        torch.cuda.synchronize()
        t = time.perf_counter()
        enc.encode(text, show_progress_bar=False)
        torch.cuda.synchronize()
        rates.append(len(text) / (time.perf_counter() - t))
        counts.append({k: v - before.get(k, 0) for k, v in _counters().items()})
    out["first_pass"] = round(rates[0])
    out["warm"] = round(statistics.median(rates[1:]))
    out["rounds"] = [round(r) for r in rates]
    out["allocations_per_pass"] = counts
    out["max_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    graphs = getattr(enc._runner, "graphs", None)
    out["graphs"] = None if graphs is None else len(graphs.graphs)
    enc.close()
    return out


def variants(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"card": torch.cuda.get_device_name(0), "runs": []}
    for arch in args.archs.split(","):
        model = random_model(arch, args.tokenizer_dir, work / arch)
        for variant in args.variants.split(","):
            env = dict(os.environ)
            if "eager" in variant.split("+"):
                env["CUDA_MODULE_LOADING"] = "EAGER"
            cmd = [sys.executable, __file__, "child", "--tokenizer-dir", str(args.tokenizer_dir)]
            cmd += ["--data-dir", str(args.data_dir), "--model", str(model), "--arch", arch, "--variant", variant]
            cmd += ["--rounds", str(args.rounds), "--sentences", str(args.sentences)]
            t = time.perf_counter()
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            wall = time.perf_counter() - t
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            run = json.loads(lines[-1]) if lines else {"arch": arch, "variant": variant, "error": done.stderr[-2000:]}
            run["process_s"] = round(wall, 1)
            print(json.dumps(run), flush=True)
            out["runs"].append(run)
    return out


def graphs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bertflow import SentenceEncoder
    from bertflow.encoding.packed import Packing, max_cosine_deviation, slotted_attention

    out: dict[str, Any] = {"card": torch.cuda.get_device_name(0), "runs": {}}
    for arch in args.archs.split(","):
        model = random_model(arch, args.tokenizer_dir, work / arch)
        enc = SentenceEncoder(str(model), pooling="mean", device="cuda")
        packed, layers = enc._runner.packed, enc.num_layers
        res = {}
        for width in (16, 32, 64):
            rows = 65536 // width
            gen = torch.Generator(device="cuda").manual_seed(width)
            ids = torch.randint(1000, enc.vocab_size, (rows, width), device="cuda", generator=gen)
            lengths = torch.randint(int(width * 0.9), width + 1, (rows,), device="cuda", generator=gen)
            packing = Packing.slots(lengths, width)

            def run(ids: torch.Tensor = ids, packing: Packing = packing, packed: Any = packed, n: int = layers) -> Any:
                return packed.states(ids, packing, [n], slotted_attention)[n]

            with torch.inference_mode():
                for _ in range(3):
                    eager = run()

                def timed(fn: Any) -> tuple[float, float]:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t = time.perf_counter()
                    start.record()
                    fn()
                    end.record()
                    host = time.perf_counter() - t
                    end.synchronize()
                    return host, start.elapsed_time(end) / 1000

                eager_t = [timed(run) for _ in range(10)]
                t = time.perf_counter()
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    run()
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    static = run()
                torch.cuda.synchronize()
                capture = time.perf_counter() - t
                graph_t = [timed(graph.replay) for _ in range(10)]
                dev = max_cosine_deviation(static.float(), eager.float())
            res[width] = {
                "slots": packing.total,
                "eager_host_s": statistics.median(h for h, _ in eager_t),
                "eager_device_s": statistics.median(d for _, d in eager_t),
                "graph_host_s": statistics.median(h for h, _ in graph_t),
                "graph_device_s": statistics.median(d for _, d in graph_t),
                "capture_s": capture,
                "max_1_minus_cos": dev,
            }
            del graph, static
        out["runs"][arch] = res
        print(json.dumps({arch: res}), flush=True)
        enc.close()
        del enc
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["variants", "graphs", "child"])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--archs", default="bert-base,minilm-l6")
    parser.add_argument("--variants", default="base,warm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=40000)
    parser.add_argument("--timeout", type=int, default=150, help="seconds per child process")
    parser.add_argument("--model", type=Path, help="child: the model folder")
    parser.add_argument("--arch", default="", help="child: its architecture")
    parser.add_argument("--variant", default="base", help="child: its steps")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "child":
        print(json.dumps(child(args)), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = variants(args, Path(tmp)) if args.what == "variants" else graphs(args, Path(tmp))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
