"""What the CLI commands share: their common options (each defined once), building encoders, reading corpora,
quieting libraries."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..calibrators import calibrator_specs

#: The file name that means standard input (for inputs) or standard output (for outputs).
STDIO = "-"

#: ``--calibrator`` help: every spec :func:`~bertflow.calibrators.parse_calibrator` knows, so none goes unlisted.
CALIBRATOR_HELP = f"{' | '.join(calibrator_specs())}, joined with '+' (e.g. standard-norm+natsv-6)."


@contextlib.contextmanager
def progress_log(logger_name: str, quiet: bool) -> Iterator[None]:
    """Show the INFO lines of ``logger_name`` on stderr as progress (message only) for the ``with`` block, unless
    ``quiet``. For library steps that report through logging (``download_sts``: one line per archive)."""
    if quiet:
        yield
        return
    logger = logging.getLogger(logger_name)
    handler = logging.StreamHandler()  # stderr, looked up at each write (so test runners can capture it)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not twice when BERTFLOW_LOG=INFO also shows library logs
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def stderr_is_terminal() -> bool:
    """Whether standard error is a terminal (a person watching), not a pipe or a file."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def announce(message: str, quiet: bool) -> None:
    """``bertflow: MESSAGE`` on stderr before a step silent for seconds (importing torch, loading a model); only on a
    terminal and without ``--quiet``, so a piped stderr keeps the one-line error the README promises."""
    if not quiet and stderr_is_terminal():
        typer.echo(f"bertflow: {message}", err=True)


def model_label(model_dirs: Sequence[str], model: str | None) -> str:
    """What a command is about to load, for :func:`announce`: the model folders, or the encoder."""
    if model_dirs:
        return ", ".join(model_dirs)
    return model or "the default encoder (all-MiniLM-L6-v2)"


def quiet_libraries(threads: int | None = None) -> None:
    """Silence transformers' per-load progress bars and info logs (bertflow shows its own progress), and apply
    ``--threads``: torch's CPU thread count for the rest of the command (``None``: torch's choice)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if threads is not None:
        from ..resources import set_torch_threads

        set_torch_threads(threads)


def fit_summary(output: str | Path, sentences: int, cal: Any, seconds: float, **extra: Any) -> str:
    """The JSON line ``fit`` and ``distributed-fit`` print: the model folder, the sentences fitted on, the calibrator,
    ``extra`` facts, the seconds and, for a flow, its last training bits per dimension."""
    summary = {"output": str(output), "sentences": sentences, "calibrator": repr(cal), **extra, "seconds": seconds}
    history = getattr(cal, "history_", None)
    if history and history["train_bpd"]:
        summary["final_train_bpd"] = round(history["train_bpd"][-1], 4)
    return json.dumps(summary)


def build_encoder(model: str | None, pooling: str, max_length: int, device: str | None, dtype: str):
    """A :class:`~bertflow.encoding.encoder.SentenceEncoder` from CLI options."""
    from ..encoding.encoder import SentenceEncoder

    return SentenceEncoder(model, pooling=pooling, max_length=max_length, device=device, dtype=dtype)


def weighted_pooling(pooling: str, weighting: str | None) -> str:
    """The pooling spec of ``--pooling`` with ``--weighting`` applied (``"sif:mean"``); InputError for an unknown
    weighting or one given both ways."""
    from ..encoding.pooling import Weighting
    from ..errors import InputError

    if weighting is None:
        return pooling
    w = Weighting.parse(weighting)
    if ":" in pooling:
        raise InputError(f"give the weighting once: --pooling {pooling!r} already has one, so drop --weighting")
    return pooling if not w.weighted else f"{w.spec}:{pooling}"


def load_embedder(model_dir: str, device: str | None, dtype: str):
    """Load a fitted :class:`~bertflow.embedder.Embedder` folder (or hub id)."""
    from ..embedder import Embedder

    return Embedder.load(model_dir, device=device, dtype=dtype)


def read_corpus(path: Path, columns: Sequence[str] | None, errors: str, unique: bool) -> list[str]:
    """Sentences from a text file (one per line) or from one or more columns of a TSV with a header."""
    from ..io.text import distinct, read_sentences, read_tsv_column

    if not columns:
        return read_sentences(path, errors=errors, unique=unique)
    sentences = [s for c in columns for s in read_tsv_column(path, column_key(c), errors=errors, refuse_blank=True)]
    return distinct(sentences) if unique else sentences


def column_key(column: str) -> str | int:
    """A ``--column`` value: a 0-based index when it is ASCII digits, else a header name (``²`` is a name: it is a
    digit to ``str.isdigit`` but not to ``int``)."""
    return int(column) if column.isascii() and column.isdigit() else column


#: Options that describe how to build or fit a model: a saved model folder fixes all of them.
MODEL_DIR_FIXES = ("model", "pooling", "max_length", "calibrator", "regime", "corpus", "seeds", "epochs")


def check_model_dir_options(ctx: typer.Context, model_dir: str | None) -> None:
    """Refuse options that a ``--model-dir`` folder already fixes (they would be silently ignored), when given on
    the command line or in the environment."""
    from ..errors import InputError

    if not model_dir:
        return
    given = [
        f"--{name.replace('_', '-')}"
        for name in MODEL_DIR_FIXES
        if name in ctx.params and getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"
    ]
    if given:
        raise InputError(
            f"{', '.join(given)} cannot be combined with --model-dir: the model folder {model_dir} fixes "
            f"{'it' if len(given) == 1 else 'them'} (encoder, pooling, max_length and calibrator are saved in it)"
        )


def check_device(device: str | None) -> str | None:
    """Refuse an unknown device, or a CUDA one on a machine without CUDA (``--device``'s callback, before any model
    is loaded)."""
    if device is not None:
        from ..encoding.device import resolve_device

        resolve_device(device)
    return device


def check_devices(devices: str | None) -> str | None:
    """``--devices``' callback: refuse an unknown or absent device before any rank starts."""
    for name in (devices or "").split(","):
        check_device(name.strip() or None)
    return devices


def check_input_file(path: Path | None) -> Path | None:
    """An input file argument's callback: ``-`` (standard input) or something that exists and is not a folder (click's
    own check refuses ``-`` for a ``Path`` in recent typer)."""
    from ..errors import InputError

    if path is not None and str(path) != STDIO:
        if not path.exists():
            raise InputError(f"cannot read {path}: no such file")
        if path.is_dir():
            raise InputError(f"cannot read {path}: it is a folder, expected a text file")
    return path


def check_text_arguments(texts: Sequence[str], what: str = "sentence") -> None:
    """Refuse command-line text that is not valid UTF-8 (Python keeps its bytes as lone surrogates)."""
    from ..errors import InputError

    for i, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(
                f"{what} {i} on the command line is not valid UTF-8 (byte 0x{ord(text[e.start]) & 0xFF:02x} at "
                f"character {e.start + 1}); pass UTF-8 text, or put the sentences in a file"
            ) from None


# -- options that several commands share, each defined once (an option of one command stays with it) ----------

CorpusArg = Annotated[
    Path,
    typer.Argument(
        help="Text file, one sentence per line, or a TSV with --column; - reads standard input.",
        callback=check_input_file,
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Hub id or local folder; default: the embedded all-MiniLM-L6-v2.")
]
ModelDirOpt = Annotated[
    str | None,
    typer.Option(
        help="A folder written by `bertflow fit` (or a hub id): its encoder and fitted calibrator replace --model, "
        "--pooling and the other model options."
    ),
]


def source_constant(module: str, name: str) -> Any:
    """The value of the module-level constant ``name = <literal>`` of bertflow's ``module`` (a path below the package
    without ``.py``: ``"encoding/device"``), read from its source without importing it, so the CLI's help quotes the
    owner's list without loading torch. A ``Literal["a", "b"]`` alias gives ``("a", "b")``. LookupError for none."""
    source = (Path(__file__).resolve().parents[1] / f"{module}.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            value = node.value
            if isinstance(value, ast.Subscript) and getattr(value.value, "id", None) == "Literal":
                value = value.slice
            return ast.literal_eval(value)
    raise LookupError(f"bertflow/{module}.py has no literal constant {name}")


def declared_poolings() -> list[str]:
    """Every name a pooling class of ``bertflow.encoding.pooling`` declares (``names = (...)``), read from the sources
    as the registry discovers them (module order), so the CLI's help lists a new pooling without importing torch."""
    names: list[str] = []
    for path in sorted((Path(__file__).resolve().parents[1] / "encoding" / "pooling").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for stmt in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["names"]:
                    names += ast.literal_eval(stmt.value)
    return names


PoolingOpt = Annotated[
    str,
    typer.Option(
        help=f"{' | '.join(declared_poolings())} | comma-separated hidden-state indices (0 = embeddings), "
        "optionally weighted: sif:first-last-avg, usif:mean, idf:mean."
    ),
]
WeightingOpt = Annotated[
    str | None,
    typer.Option(
        help="Frequency weighting of the tokens inside an averaging pooling: "
        f"{' | '.join(source_constant('encoding/pooling/weighting', 'WEIGHTING_NAMES'))} | sif-<a> (sif: "
        f"a={source_constant('encoding/pooling/weighting', 'SIF_A')}); the same as the pooling prefix "
        "(--weighting sif --pooling mean = --pooling sif:mean)."
    ),
]
TokenStatsOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-stats",
        help="Unlabeled text file (one sentence per line) to count token frequencies in for a weighted pooling, "
        "instead of the fitting sentences (see --token-source).",
        exists=True,
        dir_okay=False,
    ),
]
TokenSourceOpt = Annotated[
    str | None,
    typer.Option(
        help="Where a weighted pooling's token frequencies come from: fit (the fitting sentences; the default "
        "without --token-stats), corpus (--token-stats; the default with it) or both."
    ),
]
MaxLenOpt = Annotated[int, typer.Option(help="Tokens per sentence after truncation (the paper used 64).")]
CalibratorOpt = Annotated[str, typer.Option(help=CALIBRATOR_HELP)]
DeviceOpt = Annotated[
    str | None, typer.Option(help="cpu, cuda, cuda:1 ...; default: CUDA when available.", callback=check_device)
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        help=f"auto (bf16 on CUDA, fp32 on CPU), {', '.join(source_constant('encoding/device', 'DTYPE_NAMES'))}."
    ),
]
BatchOpt = Annotated[
    int | None,
    typer.Option(help="Cap on sentences per forward pass; default: the encoder's token budget (same results)."),
]
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option("--column", "-c", help="For a TSV corpus: column name or 0-based index to read; repeat for several."),
]
ErrorsOpt = Annotated[
    Literal[source_constant("io/text", "EncodingErrors")],
    typer.Option(
        "--encoding-errors", help="strict: stop at bytes that are not UTF-8 (naming the line); replace: use U+FFFD."
    ),
]
TextColumnOpt = Annotated[
    str | None,
    typer.Option(
        help="The text column of a Parquet / Arrow input "
        f"(default: {source_constant('io/arrow', 'DEFAULT_TEXT_COLUMN')})."
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Seed of the flow's initialisation and shuffling.")]
EpochsOpt = Annotated[float, typer.Option(help="Flow training epochs (fractions allowed).")]
ValidationFractionOpt = Annotated[float, typer.Option(help="Hold out this share; its NLL picks the flow's best step.")]
OverwriteOpt = Annotated[
    bool,
    typer.Option(
        metavar="", help="Replace a bertflow folder of the same kind already at --output (refused otherwise)."
    ),
]
OverwriteFileOpt = Annotated[
    bool,
    typer.Option(
        metavar="",
        help="Replace an existing --output file that bertflow did not write (one it wrote is replaced anyway).",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="torch CPU threads for encoding (default: torch's choice). On a machine whose cores other processes "
        "use, 1 can be several times faster than 2.",
        min=1,
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="No progress bars or lines on stderr.")]

# The distributed commands' rank options (cli/ranks.py runs the ranks).
DevicesOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated local devices, one rank each, spawned here without torchrun (cuda:0,cuda:1).",
        callback=check_devices,
    ),
]
RankDeviceOpt = Annotated[
    str | None,
    typer.Option(
        help="This rank's device; default cuda:LOCAL_RANK when CUDA is available, else cpu.", callback=check_device
    ),
]
BackendOpt = Annotated[str, typer.Option(help="torch.distributed backend: gloo (default, CPU and GPU) or nccl.")]
TimeoutOpt = Annotated[
    float, typer.Option(help="Minutes a rank waits for the slowest one at a barrier before the job fails.")
]
