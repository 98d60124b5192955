"""What calibration costs on a GPU: ``SentenceEncoder.encode`` against ``Embedder.encode`` with the eager torch
transform and with :func:`bertflow.calibrators.device.fast_torch_transform` (CUDA graphs), side by side (issue 17).

A random-weight BERT-base (speed does not depend on the weights; the GPU machine has no network) in bf16 encodes
40k STS sentences (mean pooling, max_length 64); a flow (200 steps: its transform costs the same however long it
trained) and a whitening are fitted on those embeddings. The three sides run in alternating order for 5 rounds
(medians). Also timed: the transform alone on the same rows, in the encoder's chunk sizes, eager and graphed, and
the largest difference between the two Embedder outputs (0 when the graphs replay the eager kernels exactly).

    python benchmarks/calibrator_overhead_gpu.py --tokenizer-dir TOK --data-dir STS --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import build_random_model, environment, interleave, replicate, sts_sentences

from bertflow.calibrators import FlowCalibrator, WhiteningCalibrator
from bertflow.calibrators.device import fast_torch_transform, graphed_transform
from bertflow.embedder import Embedder
from bertflow.encoding.encoder import SentenceEncoder


@contextlib.contextmanager
def eager_transforms() -> Iterator[None]:
    """Inside it, ``Embedder.encode`` applies ``calibrator.torch_transform`` op by op (what it did before issue 17's
    CUDA graphs), by swapping the one function it builds its device transform with."""
    from bertflow import embedder as module

    graphed = module.device_transform
    module.device_transform = lambda encoder, cal: None if cal is None else cal.torch_transform(encoder.device)
    try:
        yield
    finally:
        module.device_transform = graphed


def eager_encode(embedder: Embedder, sentences: list[str]) -> np.ndarray:
    with eager_transforms():
        return embedder.encode(sentences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", required=True, help="folder with vocab.txt / tokenizer.json")
    parser.add_argument("--data-dir", default=None, help="STS data folder (default: as bertflow evaluate finds it)")
    parser.add_argument("--arch", default="bert-base", help="bertflow.bench.MODEL_CONFIGS key")
    parser.add_argument("--sentences", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--flow-steps", type=int, default=200)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default=None, help="write the results here too")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time a 4th side: the graphs replaying torch.compile(transform) (fused kernels, not bit-identical)",
    )
    args = parser.parse_args()

    env = environment(args.device)
    print(f"[env] {json.dumps(env)}", flush=True)
    sentences = replicate(sts_sentences(args.data_dir), args.sentences)
    results: dict[str, Any] = {"environment": env, "sentences": len(sentences), "arch": args.arch}
    with tempfile.TemporaryDirectory(prefix="bertflow-overhead-") as tmp:
        path = build_random_model(args.arch, args.tokenizer_dir, Path(tmp) / args.arch)
        encoder = SentenceEncoder(str(path), pooling="mean", device=args.device, max_length=64)
        results["dtype"] = str(next(encoder.model.parameters()).dtype).removeprefix("torch.")
        X = encoder.encode(sentences)
        chunk_sizes = list(encoder.last_stats.chunk_sizes)
        X_device = torch.from_numpy(X).to(encoder.device)
        cals = {
            "flow": FlowCalibrator(device=args.device, max_steps=args.flow_steps).fit(X),
            "whitening": WhiteningCalibrator().fit(X),
        }
        results["chunk_sizes"] = chunk_sizes
        for name, cal in cals.items():
            embedder = Embedder(encoder, cal)
            runs = {
                "SentenceEncoder.encode": lambda: encoder.encode(sentences),
                "Embedder.encode eager": lambda e=embedder: eager_encode(e, sentences),
                "Embedder.encode graphed": lambda e=embedder: e.encode(sentences),
            }
            compiled_fn = None
            if args.compile:
                compiled_fn = graphed_transform(torch.compile(cal.torch_transform(encoder.device)), encoder.device)
                t0 = time.perf_counter()
                for _ in range(2):
                    encoder.encode(sentences, transform=compiled_fn)
                results.setdefault("compile_seconds", {})[name] = time.perf_counter() - t0
                runs["Embedder.encode graphed+compiled"] = lambda f=compiled_fn: encoder.encode(sentences, transform=f)
            for run in runs.values():  # warm-up: each chunk size seen twice, so the graphs are captured
                run()
                run()
            a, b = eager_encode(embedder, sentences), embedder.encode(sentences)
            diff = float(np.abs(a - b).max())
            times = interleave(runs, args.rounds)
            med = {k: float(np.median(v)) for k, v in times.items()}
            plain = med["SentenceEncoder.encode"]

            # The transform alone, on the same rows in the encoder's chunk sizes.
            fns = {"eager": cal.torch_transform(encoder.device), "graphed": fast_torch_transform(cal, encoder.device)}
            if compiled_fn is not None:
                fns["graphed+compiled"] = compiled_fn
                with torch.inference_mode():
                    probe = X_device[:4096]
                    results.setdefault("compiled_max_abs_diff", {})[name] = float(
                        (compiled_fn(probe) - fns["eager"](probe)).abs().max()
                    )
            parts = X_device.split(chunk_sizes)

            def alone(fn: Any, parts: Any = parts) -> None:
                with torch.inference_mode():
                    for part in parts:
                        fn(part)

            for fn in fns.values():
                alone(fn)
                alone(fn)
            alone_t = interleave({k: (lambda f=f: alone(f)) for k, f in fns.items()}, 2 * args.rounds + 1)
            alone_med = {k: float(np.median(v)) for k, v in alone_t.items()}
            results[name] = {
                "seconds": times,
                "median_s": med,
                "eager_overhead": med["Embedder.encode eager"] / plain - 1,
                "graphed_overhead": med["Embedder.encode graphed"] / plain - 1,
                "graphed_over_eager": med["Embedder.encode graphed"] / med["Embedder.encode eager"],
                "max_abs_diff_graphed_vs_eager": diff,
                "transform_alone_s": alone_med,
                "transform_alone_seconds": alone_t,
                "graphed_shapes": fns["graphed"].shapes if hasattr(fns["graphed"], "shapes") else [],
            }
            if compiled_fn is not None:
                r = results[name]
                r["compiled_overhead"] = med["Embedder.encode graphed+compiled"] / plain - 1
                print(
                    f"[{name}] graphed+compiled: {100 * r['compiled_overhead']:+.2f}%, transform alone "
                    f"{1e3 * alone_med['graphed+compiled']:.2f} ms, compile {results['compile_seconds'][name]:.1f} s, "
                    f"max|compiled-eager| {results['compiled_max_abs_diff'][name]:.1e}",
                    flush=True,
                )
            r = results[name]
            print(
                f"[{name}] SentenceEncoder.encode {plain:.4f} s | Embedder eager {med['Embedder.encode eager']:.4f} s "
                f"({100 * r['eager_overhead']:+.2f}%) | Embedder graphed {med['Embedder.encode graphed']:.4f} s "
                f"({100 * r['graphed_overhead']:+.2f}%) | max|graphed-eager| {diff:.1e} | transform alone: eager "
                f"{1e3 * alone_med['eager']:.2f} ms, graphed {1e3 * alone_med['graphed']:.2f} ms",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    what = f"{args.arch} {results['dtype']}, {len(sentences)} STS sentences, chunks {chunk_sizes}"
    print(f"\ncard: {env.get('gpu', args.device)}; {what}")
    head = f"{'calibrator':10s} {'eager overhead':>15s} {'graphed overhead':>17s} {'graphed/eager':>14s}"
    print(f"{head} {'max diff':>9s}")
    for name in cals:
        r = results[name]
        print(
            f"{name:10s} {100 * r['eager_overhead']:+14.2f}% {100 * r['graphed_overhead']:+16.2f}% "
            f"{r['graphed_over_eager']:14.4f} {r['max_abs_diff_graphed_vs_eager']:9.1e}"
        )


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"[wall] {time.perf_counter() - t0:.0f} s")
