"""``bertflow bench cpu``, ``bertflow bench flow`` and ``bertflow bench suite``: speed benchmarks that print
measured side-by-side ratios.

The logic lives in :mod:`bertflow.bench`; these commands only parse options. Numbers and how they were taken
are in ``docs/performance.md``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .options import check_device, quiet_libraries

bench_app = typer.Typer(
    help="Speed benchmarks: bertflow against sentence-transformers, flow fitting, calibrator overhead, memory.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")

JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write every number to this JSON file.")]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress or result lines; the numbers go to --json only.")
]
DataOpt = Annotated[Path | None, typer.Option(help="STS data folder (default: found as bertflow evaluate finds it).")]


@bench_app.command(
    epilog="""Examples:

  bertflow bench cpu

  bertflow bench cpu --sentences 2000 --rounds 7 --json cpu.json
"""
)
def cpu(
    sentences: Annotated[int, typer.Option(help="STS sentences (a seeded sample) encoded per run.")] = 1000,
    long: Annotated[int, typer.Option(help="Paragraph-length texts (max_length 256) encoded per run.")] = 100,
    rounds: Annotated[int, typer.Option(help="Timed runs per system, interleaved A B / B A; median reported.")] = 5,
    data_dir: DataOpt = None,
    json_path: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Embedded default model on this CPU: bertflow vs SentenceTransformer.encode (fp32, same sentences and
    max_length), then STS-B flow fitting time and calibrator transform overhead."""
    from ..bench import cpu_comparison

    _check_json(json_path, quiet)
    quiet_libraries()
    cpu_comparison(json_path, sentences=sentences, long=long, rounds=rounds, data_dir=data_dir, log=_log(quiet))


@bench_app.command(
    epilog="""Examples:

  bertflow bench suite --tokenizer-dir tok --json results.json            (on a GPU machine)

  bertflow bench suite --tokenizer-dir tok --device cpu --scale tiny      (check the benchmark code)
"""
)
def suite(
    tokenizer_dir: Annotated[
        Path, typer.Option(help="Folder with a BERT vocab.txt / tokenizer.json for the random-weight models.")
    ],
    json_path: Annotated[Path, typer.Option("--json", help="Where the results go (rewritten after each part).")] = Path(
        "bench-suite.json"
    ),
    device: Annotated[str, typer.Option(help="cuda, cuda:1 ... or cpu.")] = "cuda",
    scale: Annotated[str, typer.Option(help="full (GPU sizes) or tiny (seconds, to test the code).")] = "full",
    deadline: Annotated[float, typer.Option(help="Seconds after which optional parts are skipped.")] = 540.0,
    workdir: Annotated[
        Path | None, typer.Option(help="Scratch folder for models and files (default: a temp dir).")
    ] = None,
    data_dir: DataOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """The GPU suite: random-weight BERT-base and MiniLM-L6 against sentence-transformers (STS and long texts),
    bertflow variants, bf16 vs fp32, memory of `bertflow encode`, flow fitting on 1M vectors, calibrator overhead."""
    from ..bench import SUITE_SCALES, run_suite

    _check_json(json_path, quiet)
    check_device(device)
    quiet_libraries()
    if scale not in SUITE_SCALES:
        from ..errors import InputError

        raise InputError(f"unknown scale {scale!r}: use {' or '.join(SUITE_SCALES)}")
    with tempfile.TemporaryDirectory(prefix="bertflow-bench-") as tmp:
        run_suite(
            tokenizer_dir,
            workdir or Path(tmp),
            json_path,
            data_dir=data_dir,
            device=device,
            scale=scale,
            deadline_s=deadline,
            log=_log(quiet),
        )


@bench_app.command(
    epilog="""Examples:

  bertflow bench flow --json flow.json                              (on a GPU: 1M x 768, one epoch)

  bertflow bench flow --rows 20000 --device cpu --probe-steps 50
"""
)
def flow(
    rows: Annotated[int, typer.Option(help="Random vectors to fit on.")] = 1_000_000,
    dim: Annotated[int, typer.Option(help="Their dimension.")] = 768,
    device: Annotated[str, typer.Option(help="cuda, cuda:1 ... or cpu.")] = "cuda",
    probe_steps: Annotated[int, typer.Option(help="Steps per side-by-side run of the two loops.")] = 1000,
    epoch: Annotated[bool, typer.Option(help="Also time one whole epoch.")] = True,
    json_path: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Flow fitting speed: one epoch of FlowCalibrator() on random vectors, and the training loop with and without
    its CUDA graph side by side (time per step, and whether both give identical flows)."""
    import numpy as np

    from ..bench import bench_flow_fit_gpu, environment, save_json

    _check_json(json_path, quiet)
    check_device(device)
    X = np.random.default_rng(0).normal(size=(rows, dim)).astype(np.float32)
    out = {
        "environment": environment(device),
        "flow_fit": bench_flow_fit_gpu(X, device=device, probe_steps=probe_steps, full_epoch=epoch, log=_log(quiet)),
    }
    if json_path:
        save_json(out, json_path)


def _check_json(json_path: Path | None, quiet: bool = False) -> None:
    """The results file can be written: checked before the benchmark runs, not after. ``-q`` without ``--json``
    would run the benchmark and show nothing, so it is refused."""
    from ..errors import InputError
    from ..io.files import check_output_file

    if quiet and json_path is None:
        raise InputError("-q hides every result line; add --json FILE to keep the numbers")
    if json_path is not None:
        check_output_file(json_path)


def _log(quiet: bool):  # noqa: ANN202 - the benchmarks' log callable
    """What the benchmarks print their progress and results with: ``print``, or nothing with ``-q``."""
    return (lambda _line: None) if quiet else print
