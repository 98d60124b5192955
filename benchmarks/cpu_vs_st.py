"""CPU benchmark: the embedded default model (all-MiniLM-L6-v2, fp32) in bertflow against sentence-transformers.

Both run in this one process on the same sentences and max_length, in alternating rounds (A B, B A, ...), so
background load on a shared machine hits both; the median of each is reported with their ratio. Then the
STS-B flow fitting time and the calibrator transform overhead. Same as ``bertflow bench cpu``.

    python benchmarks/cpu_vs_st.py --sentences 1000 --rounds 5 --json cpu.json
"""

from __future__ import annotations

import argparse

from bertflow.bench import cpu_comparison


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=1000, help="STS sentences per run (seeded sample)")
    parser.add_argument("--long", type=int, default=100, help="paragraph-length texts per run (max_length 256)")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per system, interleaved")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", default=None, help="also write every number here")
    args = parser.parse_args()
    cpu_comparison(args.json, sentences=args.sentences, long=args.long, rounds=args.rounds, data_dir=args.data_dir)


if __name__ == "__main__":
    main()
