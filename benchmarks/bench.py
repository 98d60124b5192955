"""Speed benchmarks that print measured side-by-side ratios (the harness: ``benchmarks/harness/``).

    python benchmarks/bench.py cpu                      # default model on this CPU vs sentence-transformers
    python benchmarks/bench.py cpu --sentences 2000 --rounds 7 --json cpu.json
    python benchmarks/bench.py flow --json flow.json    # on a GPU: 1M x 768, one epoch, CUDA graph vs eager
    python benchmarks/bench.py flow --rows 20000 --device cpu --probe-steps 50
    python benchmarks/bench.py suite --tokenizer-dir TOK --data-dir STS --json results.json      (on a GPU)
    python benchmarks/bench.py suite --tokenizer-dir TOK --device cpu --scale tiny              (check the code)

Numbers and how they were taken: docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # loaded by path (the tests) rather than run: the harness sits beside this file
    sys.path.insert(0, str(HERE))
try:  # run from a checkout without installing: the device machines have torch and transformers, not bertflow
    import bertflow  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

from bertflow.errors import BertflowError, InputError  # noqa: E402


class _Parser(argparse.ArgumentParser):
    """An option error is an :class:`InputError` (one line from the caller), not argparse's usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see {self.prog} --help)")


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line: ``cpu``, ``flow`` and ``suite`` with their options."""
    main_parser = _Parser(prog=prog, description=__doc__.split("\n")[0])
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="{cpu,flow,suite}")

    def common(p: argparse.ArgumentParser, json_default: str | None = None) -> None:
        p.add_argument("--json", dest="json_path", type=Path, default=json_default, help="also write every number here")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress or result lines (needs --json)")

    cpu = commands.add_parser(
        "cpu",
        help="embedded default model on this CPU: bertflow vs SentenceTransformer.encode, flow fit, overhead",
        description="Embedded default model on this CPU: bertflow vs SentenceTransformer.encode (fp32, same sentences "
        "and max_length), then STS-B flow fitting time and calibrator transform overhead.",
    )
    cpu.add_argument("--sentences", type=int, default=1000, help="STS sentences (a seeded sample) encoded per run")
    cpu.add_argument("--long", type=int, default=100, help="paragraph-length texts (max_length 256) encoded per run")
    cpu.add_argument("--rounds", type=int, default=5, help="timed runs per system, interleaved A B / B A; median")
    cpu.add_argument("--data-dir", type=Path, default=None, help="STS data folder (default: as bertflow evaluate)")
    common(cpu)

    flow = commands.add_parser(
        "flow",
        help="flow fitting speed: one epoch, and the loop with and without its CUDA graph",
        description="Flow fitting speed: one epoch of FlowCalibrator() on random vectors, and the training loop with "
        "and without its CUDA graph side by side (time per step, and whether both give identical flows).",
    )
    flow.add_argument("--rows", type=int, default=1_000_000, help="random vectors to fit on")
    flow.add_argument("--dim", type=int, default=768, help="their dimension")
    flow.add_argument("--device", default="cuda", help="cuda, cuda:1 ... or cpu")
    flow.add_argument("--probe-steps", type=int, default=1000, help="steps per side-by-side run of the two loops")
    flow.add_argument("--epoch", action=argparse.BooleanOptionalAction, default=True, help="also time one epoch")
    common(flow)

    suite = commands.add_parser(
        "suite",
        help="the GPU suite: random-weight BERT-base and MiniLM-L6 vs sentence-transformers, and the rest",
        description="The GPU suite: random-weight BERT-base and MiniLM-L6 against sentence-transformers (STS and long "
        "texts), bertflow variants, bf16 vs fp32, memory of `bertflow encode`, flow fitting on 1M vectors, "
        "calibrator overhead. Results are rewritten after each part.",
    )
    suite.add_argument("--tokenizer-dir", type=Path, required=True, help="folder with vocab.txt / tokenizer.json")
    suite.add_argument("--device", default="cuda", help="cuda, cuda:1 ... or cpu")
    suite.add_argument("--scale", default="full", help="full (GPU sizes) or tiny (seconds, to test the code)")
    suite.add_argument("--deadline", type=float, default=540.0, help="seconds after which optional parts skip")
    suite.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    suite.add_argument("--data-dir", type=Path, default=None, help="STS data folder (default: as bertflow evaluate)")
    common(suite, json_default="bench-suite.json")
    return main_parser


def parse(argv: Sequence[str], prog: str | None = None) -> argparse.Namespace:
    """The options of ``argv``, checked: nothing has run yet when this returns.

    Raises:
        BertflowError: bad options (unknown ones, ``-q`` without ``--json``, an unwritable results file, an
            unknown device or scale).
    """
    import harness

    args = parser(prog).parse_args(list(argv))
    if args.quiet and args.json_path is None:
        raise InputError("-q hides every result line; add --json FILE to keep the numbers")
    if args.json_path is not None:
        from bertflow.io.files import check_output_file

        check_output_file(args.json_path)
    if args.command in ("flow", "suite"):
        _check_device(args.device)
    if args.command == "suite" and args.scale not in harness.SUITE_SCALES:
        raise InputError(f"unknown scale {args.scale!r}: use {' or '.join(harness.SUITE_SCALES)}")
    return args


def run(args: argparse.Namespace) -> None:
    """Run the benchmark that :func:`parse` returned the options of."""
    import harness

    log: Callable[[str], None] = (lambda _line: None) if args.quiet else print
    if args.command == "cpu":
        _quiet_libraries()
        harness.cpu_comparison(
            args.json_path,
            sentences=args.sentences,
            long=args.long,
            rounds=args.rounds,
            data_dir=args.data_dir,
            log=log,
        )
    elif args.command == "flow":
        import numpy as np

        X = np.random.default_rng(0).normal(size=(args.rows, args.dim)).astype(np.float32)
        out = {
            "environment": harness.environment(args.device),
            "flow_fit": harness.bench_flow_fit_gpu(
                X, device=args.device, probe_steps=args.probe_steps, full_epoch=args.epoch, log=log
            ),
        }
        if args.json_path:
            harness.save_json(out, args.json_path)
    else:
        _quiet_libraries()
        with tempfile.TemporaryDirectory(prefix="bertflow-bench-") as tmp:
            harness.run_suite(
                args.tokenizer_dir,
                args.workdir or Path(tmp),
                args.json_path,
                data_dir=args.data_dir,
                device=args.device,
                scale=args.scale,
                deadline_s=args.deadline,
                log=log,
            )


def _check_device(device: str) -> None:
    """An unknown device, or CUDA on a machine without it, is refused before anything is timed."""
    from bertflow.encoding.device import resolve_device

    resolve_device(device)


def _quiet_libraries() -> None:
    """No per-load progress bars or info logs from transformers between the result lines."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    """Run from the shell: a bad option is one line on stderr and exit status 2."""
    try:
        run(parse(sys.argv[1:] if argv is None else argv))
    except BertflowError as e:
        print(f"{Path(__file__).name}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
