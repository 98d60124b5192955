"""Issue 23, for the next call: does the pre-fault help ``Embedder.encode`` (a calibrator's transform) as it helps
``SentenceEncoder.encode``? Call g's rule compared *overheads* (Embedder against SentenceEncoder), whose denominator
the pre-fault moves too; this probe compares the absolute times of the same call with and without it.

A random-weight BERT-base (bf16, mean pooling, max_length 64) encodes 40k STS sentences; a flow (200 steps) and a
whitening are fitted on them. Sides, alternating for ``--rounds`` rounds (medians):
- ``SentenceEncoder.encode``: the library (pre-faults: no transform);
- ``Embedder.encode``: the library (no pre-fault with a transform);
- ``Embedder.encode prefaulted``: a second encoder of the same weights whose ``encode`` gets a result pre-faulted on a
  thread at the encoder's width (``fourteenth_pass_1xGPU/prefault_variant.py``'s shim; flow and whitening keep it).

    python transform_prefault_probe.py --tokenizer-dir TOK --data-dir STS --json out.json
    python transform_prefault_probe.py --tokenizer-dir TOK --device cpu --arch tiny --sentences 3000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fourteenth_pass_1xGPU"))
from harness import build_random_model, environment, interleave, replicate, sts_sentences  # noqa: E402
from prefault_variant import prefaulting  # noqa: E402  (its pair_variant puts src/ and benchmarks/ on sys.path)

from bertflow.calibrators import FlowCalibrator, WhiteningCalibrator  # noqa: E402
from bertflow.embedder import Embedder  # noqa: E402
from bertflow.encoding.encoder import SentenceEncoder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--arch", default="bert-base")
    parser.add_argument("--sentences", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sentences = replicate(sts_sentences(args.data_dir), args.sentences)
    results: dict[str, Any] = {"environment": environment(args.device), "sentences": len(sentences)}
    with tempfile.TemporaryDirectory(prefix="bertflow-probe-") as tmp:
        path = build_random_model(args.arch, args.tokenizer_dir, Path(tmp) / args.arch)
        plain = SentenceEncoder(str(path), pooling="mean", device=args.device, max_length=64)
        shimmed = prefaulting(SentenceEncoder(str(path), pooling="mean", device=args.device, max_length=64))
        X = plain.encode(sentences)
        cals = {
            "flow": FlowCalibrator(device=args.device, max_steps=200).fit(X),
            "whitening": WhiteningCalibrator().fit(X),
        }
        for name, cal in cals.items():
            lib, pre = Embedder(plain, cal), Embedder(shimmed, cal)
            if not np.array_equal(lib.encode(sentences), pre.encode(sentences)):
                raise SystemExit(f"{name}: the prefaulted side gives other vectors")
            runs = {
                "SentenceEncoder.encode": lambda: plain.encode(sentences),
                "Embedder.encode": lambda e=lib: e.encode(sentences),
                "Embedder.encode prefaulted": lambda e=pre: e.encode(sentences),
            }
            for run in runs.values():  # each chunk size seen twice: the transform's graphs are captured
                run()
                run()
            times = interleave(runs, args.rounds)
            med = {k: float(np.median(v)) for k, v in times.items()}
            results[name] = {"seconds": times, "median_s": med}
            base, lib_s, pre_s = (
                med["SentenceEncoder.encode"],
                med["Embedder.encode"],
                med["Embedder.encode prefaulted"],
            )
            print(
                f"{name}: SentenceEncoder {base:.4f} s | Embedder {lib_s:.4f} s ({100 * (lib_s / base - 1):+.2f}%) | "
                f"prefaulted {pre_s:.4f} s ({100 * (pre_s / base - 1):+.2f}%)",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
