"""Issue 23, sixteenth pass: what a calibrator's transform costs ``Embedder.encode`` on a GPU, and where.

A random-weight BERT-base (bf16, mean pooling, max_length 64) encodes 40k STS sentences; a flow (200 steps) and a
whitening are fitted on them. For each calibrator, three sides alternate for ``--rounds`` rounds (medians):
- ``SentenceEncoder.encode``: the library, no calibrator;
- ``Embedder.encode``: the library (since 4d61993 its result is pre-faulted with a transform too);
- ``Embedder.encode side stream``: a second encoder of the same weights whose transforms run on a CUDA stream of
  their own (``side_stream_variant.py``); its vectors must equal the library's bit for bit.
Then one more pass of each side under ``torch.profiler``: the GPU's busy time (the union of kernel and copy
intervals), its idle time inside the pass, the total kernel time, and the kernels that the side adds over
``SentenceEncoder.encode`` (by name, milliseconds).

    python transform_probe.py --tokenizer-dir TOK --data-dir STS --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fourteenth_pass_1xGPU"))
import pair_variant  # noqa: E402,F401  (puts src/ and benchmarks/ first on sys.path)
from harness import build_random_model, environment, interleave, replicate, sts_sentences  # noqa: E402
from side_stream_variant import side_stream  # noqa: E402

from bertflow.calibrators import FlowCalibrator, WhiteningCalibrator  # noqa: E402
from bertflow.embedder import Embedder  # noqa: E402
from bertflow.encoding.encoder import SentenceEncoder  # noqa: E402


def profiled(run: Any) -> dict[str, Any]:
    """One pass of ``run`` under torch.profiler: wall, GPU busy (union of device intervals), kernel time by name."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    spans = []
    by_name: collections.Counter[str] = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            spans.append((e.time_range.start, e.time_range.end))
            by_name[e.name[:90]] += (e.time_range.end - e.time_range.start) / 1e3
    spans.sort()
    busy, end = 0.0, -1.0
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    first, last = (spans[0][0], max(b for _, b in spans)) if spans else (0, 0)
    return {
        "gpu_span_ms": (last - first) / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "gpu_idle_ms": (last - first - busy) / 1e3,
        "kernel_ms": sum(by_name.values()),
        "by_name_ms": dict(by_name),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--arch", default="bert-base")
    parser.add_argument("--sentences", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sentences = replicate(sts_sentences(args.data_dir), args.sentences)
    results: dict[str, Any] = {"environment": environment("cuda"), "sentences": len(sentences)}
    with tempfile.TemporaryDirectory(prefix="bertflow-probe-") as tmp:
        path = build_random_model(args.arch, args.tokenizer_dir, Path(tmp) / args.arch)
        plain = SentenceEncoder(str(path), pooling="mean", device="cuda", max_length=64)
        side = side_stream(SentenceEncoder(str(path), pooling="mean", device="cuda", max_length=64))
        X = plain.encode(sentences)
        cals = {
            "flow": FlowCalibrator(device="cuda", max_steps=200).fit(X),
            "whitening": WhiteningCalibrator().fit(X),
        }
        for name, cal in cals.items():
            lib, alt = Embedder(plain, cal), Embedder(side, cal)
            runs = {
                "SentenceEncoder.encode": lambda: plain.encode(sentences),
                "Embedder.encode": lambda e=lib: e.encode(sentences),
                "Embedder.encode side stream": lambda e=alt: e.encode(sentences),
            }
            for run in runs.values():  # each chunk size seen twice: the transform's graphs are captured
                run()
                run()
            same = bool(np.array_equal(lib.encode(sentences), alt.encode(sentences)))
            times = interleave(runs, args.rounds)
            med = {k: float(np.median(v)) for k, v in times.items()}
            prof = {k: profiled(run) for k, run in runs.items()}
            base_kernels = prof["SentenceEncoder.encode"]["by_name_ms"]
            for p in prof.values():
                extra = {k: v - base_kernels.get(k, 0.0) for k, v in p.pop("by_name_ms").items()}
                top = sorted(((k, v) for k, v in extra.items() if v > 0.05), key=lambda kv: -kv[1])
                p["added_kernels_ms"] = dict(top[:12])
            results[name] = {"seconds": times, "median_s": med, "identical": same, "profile": prof}
            base = med["SentenceEncoder.encode"]
            print(
                f"{name}: SentenceEncoder {base:.4f} s | Embedder {med['Embedder.encode']:.4f} s "
                f"({100 * (med['Embedder.encode'] / base - 1):+.2f}%) | side stream "
                f"{med['Embedder.encode side stream']:.4f} s "
                f"({100 * (med['Embedder.encode side stream'] / base - 1):+.2f}%), identical {same}",
                flush=True,
            )
            for k, p in prof.items():
                print(
                    f"   {k:>28}: GPU span {p['gpu_span_ms']:.1f} ms, busy {p['gpu_busy_ms']:.1f}, idle "
                    f"{p['gpu_idle_ms']:.1f}, kernels {p['kernel_ms']:.1f} ms; added: "
                    + ", ".join(f"{n[:40]} {v:.2f}" for n, v in list(p["added_kernels_ms"].items())[:5]),
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
