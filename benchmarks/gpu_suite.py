"""The GPU benchmark suite in one command (one lease of the device machine): see ``bertflow.bench.run_suite``.

Random-weight BERT-base and MiniLM-L6 (all-MiniLM-L6-v2's architecture) are built from their configs with a local
tokenizer (speed does not depend on the weights; the GPU machine has no network), then: encoding against
``SentenceTransformer.encode`` on STS sentences and on paragraph-length texts (bf16, same sentences and
max_length, interleaved rounds), bertflow's variants, bf16 vs fp32, the memory of ``bertflow encode`` on 200k
and 1M lines, calibrator transform overhead, and flow fitting on 1M random 768-d vectors.

    python benchmarks/gpu_suite.py --tokenizer-dir TOK --data-dir STS --json results.json

``--scale tiny --device cpu`` checks the whole script in about a minute on a CPU.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bertflow.bench import SUITE_SCALES, run_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", required=True, help="folder with vocab.txt / tokenizer.json")
    parser.add_argument("--data-dir", default=None, help="STS data folder (default: as bertflow evaluate finds it)")
    parser.add_argument("--json", default="bench-suite.json", help="results file, rewritten after each part")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="full", choices=sorted(SUITE_SCALES))
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds after which optional parts skip")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bertflow-bench-") as tmp:
        run_suite(
            args.tokenizer_dir,
            Path(args.workdir or tmp),
            args.json,
            data_dir=args.data_dir,
            device=args.device,
            scale=args.scale,
            deadline_s=args.deadline,
        )


if __name__ == "__main__":
    main()
