"""Flow fitting speed: one epoch of ``FlowCalibrator()`` on N random D-dimensional vectors, and its training
loop with and without the CUDA graph side by side (see ``bertflow.bench.bench_flow_fit_gpu``).

    python benchmarks/flow_fit.py --rows 1000000 --json flow-fit.json     (on a GPU: the issue's 60 s target)
    python benchmarks/flow_fit.py --rows 20000 --device cpu --probe-steps 50

Same as ``bertflow bench flow``.
"""

from __future__ import annotations

import argparse

import numpy as np

from bertflow.bench import bench_flow_fit_gpu, environment, save_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--probe-steps", type=int, default=1000, help="steps per side-by-side run")
    parser.add_argument("--no-epoch", action="store_true", help="skip the whole-epoch fit")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()
    X = np.random.default_rng(0).normal(size=(args.rows, args.dim)).astype(np.float32)
    out = {
        "environment": environment(args.device),
        "flow_fit": bench_flow_fit_gpu(
            X, device=args.device, probe_steps=args.probe_steps, full_epoch=not args.no_epoch
        ),
    }
    if args.json:
        save_json(out, args.json)


if __name__ == "__main__":
    main()
