"""``bertflow evaluate``, ``bertflow reproduce``, ``bertflow analyze`` and ``bertflow download-sts``."""

from __future__ import annotations

import inspect
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from ..evaluation.datasets import DATA_DIR_ENV, DEFAULT_CACHE_DIR, STS_TASKS
from ..paper.published import PAPER_MODELS
from ..paper.regimes import REGIME_TEXT, REGIMES
from ._app import app
from .options import (
    BatchOpt,
    CalibratorOpt,
    ColumnOpt,
    DeviceOpt,
    DtypeOpt,
    EncodingErrors,
    EpochsOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelDirOpt,
    ModelOpt,
    PoolingOpt,
    QuietOpt,
    SeedOpt,
    ThreadsOpt,
    check_device,
    check_model_dir_options,
    limit_threads,
    load_embedder,
    progress_log,
    quiet_libraries,
    read_corpus,
)

RegimeOpt = Annotated[
    str,
    typer.Option(
        help="What the calibrator is fitted on: "
        + " | ".join(f"{name} ({REGIME_TEXT[name]})" for name in REGIMES)
        + " | per-set (every STS12-16 subset, STS-B, SICK-R scored alone, each fitted on its own "
        "sentences; with --fit-sizes)."
    ),
]
CorpusOpt = Annotated[
    Path | None,
    typer.Option(
        help="Text file (one sentence per line, or TSV with --column) for the corpus regime.",
        exists=True,
        dir_okay=False,
    ),
]
_ALL_TASKS = ",".join(STS_TASKS)
TasksOpt = Annotated[str, typer.Option(help=f"Comma-separated STS tasks: {_ALL_TASKS}.")]
#: Where the CLI looks for the STS data folder when ``--data-dir`` is not given, after ``$BERTFLOW_DATA_DIR``: a
#: checkout beside the shared data (``./shared`` or ``../shared``, relative to the working directory), then where
#: ``bertflow download-sts`` builds it. The library has no such default: its functions take the folder.
DATA_DIR_CANDIDATES = ("shared/data/sts", "../shared/data/sts", str(DEFAULT_CACHE_DIR))
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        help=f"STS data folder (default: ${DATA_DIR_ENV}, else the first existing of {', '.join(DATA_DIR_CANDIDATES)})."
    ),
]
CacheDirOpt = Annotated[
    Path | None,
    typer.Option(help="Embedding cache folder (default: $BERTFLOW_CACHE_DIR or ~/.cache/bertflow/embeddings)."),
]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", metavar="", help="Do not read or write the embedding cache.")]
SeedsOpt = Annotated[int, typer.Option(help="Flow rows: fit with seeds 0..N-1 and report mean ± std.")]
FitSizesOpt = Annotated[
    str | None,
    typer.Option(
        help="Regime per-set: also fit each set on seeded random samples of these many of its sentences "
        "(comma-separated, e.g. 100,300,1000; only sets with more sentences), besides all of them."
    ),
]
SampleSeedOpt = Annotated[int, typer.Option(help="Regime per-set: the seed of the --fit-sizes samples.")]

PoolingsOpt = Annotated[
    str,
    typer.Option(help="Comma-separated poolings (layer lists joined by '+': 'mean,1+-1'); one encoder pass for all."),
]
CalibratorsOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated calibrator specs; default: none, standard-norm, natsv-10, standard-norm+natsv-6, "
        "whitening, whitening-K (K = 256 for 768 dims, 384 for 1024, else D/3), flow, flow-paper."
    ),
]
RegimesOpt = Annotated[
    str,
    typer.Option(
        help=f"Comma-separated: {', '.join(REGIMES)}; or per-set alone (every STS12-16 subset, STS-B, "
        "SICK-R scored on its own, each fitted on its own sentences: mean, worst set and count below raw)."
    ),
]
SelectOpt = Annotated[
    str | None,
    typer.Option(
        help="Regime per-set: 'lodo' adds the leave-one-dataset-out choice among the grid's configurations "
        "(picked on the other datasets, scored on the held-out one)."
    ),
]
PaperRowsOpt = Annotated[
    str | None,
    typer.Option(
        "--paper-rows",
        help=f"Show this paper model's published rows ({' or '.join(PAPER_MODELS)}) beside another "
        "encoder's, captioned with how the two differ.",
    ),
]
ComparesOpt = Annotated[
    str | None,
    typer.Option(help="Comma-separated calibrator specs fitted the same way and shown beside --calibrator."),
]
VectorOpt = Annotated[str | None, typer.Option(help="Also write each plot as pdf and/or svg (comma-separated).")]
PlotsOpt = Annotated[bool, typer.Option(metavar="", help="Draw the PNG plots (needs matplotlib).")]


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def find_data_dir(data_dir: Path | None) -> Path:
    """The STS data folder of a command: ``--data-dir`` if given, else ``$BERTFLOW_DATA_DIR``, else the first
    existing of :data:`DATA_DIR_CANDIDATES`; absolute.

    Raises:
        DataNotFoundError: the named folder does not exist, or none of the defaults does; the message says how to
            point at a local copy and how to download the data.
    """
    import os

    from ..errors import DataNotFoundError
    from ..evaluation.datasets import HOW_TO_GET_DATA, resolve_data_dir

    if data_dir is not None:
        return resolve_data_dir(data_dir)
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        if not Path(env).expanduser().is_dir():
            raise DataNotFoundError(f"{DATA_DIR_ENV}={env} is not an existing folder. {HOW_TO_GET_DATA}")
        return resolve_data_dir(env)
    candidates = [Path(c).expanduser() for c in DATA_DIR_CANDIDATES]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise DataNotFoundError(f"no STS data folder found (looked in {tried}). {HOW_TO_GET_DATA}")


def _command(name: str, options: Sequence[tuple[str, Any]]) -> str:
    """A re-runnable command line from the options that differ from the defaults (``None`` / False omitted)."""
    parts = ["bertflow", name]
    for flag, value in options:
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            for v in value:
                parts += [flag, str(v)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def _fit_sizes(text: str | None, per_set: bool) -> list[int]:
    """``--fit-sizes 100,300,1000`` as integers, checked before any work (only with the per-set regime)."""
    from ..errors import InputError

    if text is None:
        return []
    if not per_set:
        raise InputError("--fit-sizes belongs to the per-set regime: --regimes per-set (evaluate: --regime per-set)")
    try:
        sizes = [int(part) for part in _split(text)]
    except ValueError:
        raise InputError(f"--fit-sizes takes comma-separated whole numbers (100,300,1000), got {text!r}") from None
    if not sizes or min(sizes) < 2:
        raise InputError(f"--fit-sizes must be whole numbers of at least 2, got {text!r}")
    return sizes


def _progress(quiet: bool):  # noqa: ANN202 - a callable or None
    return None if quiet else (lambda msg: typer.echo(msg, err=True))


def _cache(cache_dir: Path | None, no_cache: bool):  # noqa: ANN202
    from ..evaluation.cache import EmbeddingCache

    return None if no_cache else EmbeddingCache(cache_dir)


def _corpus(corpus: Path | None, column: list[str] | None, errors: EncodingErrors) -> list[str] | None:
    return read_corpus(corpus, column, errors.value, True) if corpus is not None else None


def _check_report(output: Path | None, stem: str) -> None:
    """Before any work: the report files ``OUTPUT/STEM.md`` and ``.json`` can be written (only they are replaced)."""
    from ..io.files import check_output_file

    if output is not None:
        if output.exists() and not output.is_dir():
            _raise_output(f"cannot write the report to {output}: it exists and is not a folder")
        for suffix in (".md", ".json"):
            check_output_file(output / f"{stem}{suffix}", create_parents=True)


def _raise_input(message: str) -> None:
    from ..errors import InputError

    raise InputError(message)


def _raise_output(message: str) -> None:
    from ..errors import OutputError

    raise OutputError(message)


def _write(output: Path | None, stem: str, markdown: str, data: dict[str, Any]) -> None:
    from ..io.files import atomic_write_text

    if output is None:
        return
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / f"{stem}.md", markdown)
    atomic_write_text(output / f"{stem}.json", json.dumps(data, indent=2, allow_nan=False) + "\n")


@app.command(
    epilog="""Examples:

  bertflow evaluate                                  (raw embedded default model, 7 STS tasks)

  bertflow evaluate --calibrator whitening --regime nli -o eval-white

  bertflow evaluate --calibrator flow --regime corpus --corpus my-sentences.txt

  bertflow evaluate --model-dir my-flow              (a model saved by `bertflow fit`)
"""
)
def evaluate(
    ctx: typer.Context,
    model_dir: ModelDirOpt = None,
    model: ModelOpt = None,
    pooling: PoolingOpt = "mean",
    calibrator: CalibratorOpt = "none",
    regime: RegimeOpt = "target",
    corpus: CorpusOpt = None,
    column: ColumnOpt = None,
    tasks: TasksOpt = _ALL_TASKS,
    seeds: SeedsOpt = 1,
    epochs: EpochsOpt = 1.0,
    fit_sizes: FitSizesOpt = None,
    sample_seed: SampleSeedOpt = 0,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Folder for evaluate.md and evaluate.json.")
    ] = None,
    data_dir: DataDirOpt = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    max_length: MaxLenOpt = 64,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    encoding_errors: ErrorsOpt = EncodingErrors.strict,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """STS evaluation (Spearman x100, "all" and "wmean", per subset) of an encoder + calibrator, with its regime."""
    options = {name: value for name, value in locals().items() if name != "ctx"}
    _check_report(output, "evaluate")
    check_device(device)
    check_model_dir_options(ctx, model_dir)
    regime = options["regime"] = regime.strip().lower()
    sizes = _fit_sizes(fit_sizes, regime == "per-set" and not model_dir)
    if regime == "per-set" and corpus is not None:
        _raise_input("--corpus has no role in the per-set regime: each set is fitted on its own sentences")
    quiet_libraries()
    limit_threads(threads)
    root = find_data_dir(data_dir)
    if model_dir:
        from ..paper.grid import evaluate_embedder

        echo = [("--model-dir", model_dir), ("--tasks", _tasks_echo(tasks)), ("--data-dir", data_dir)]
        result = evaluate_embedder(
            load_embedder(model_dir, device, dtype),
            task_names=_split(tasks),
            data_dir=root,
            cache=_cache(cache_dir, no_cache),
            batch_size=batch_size,
            command=_command("evaluate", echo),
        )
    else:
        if corpus is not None and regime == "target":
            options["regime"] = "corpus"  # --corpus alone means: fit on it
        config = _grid_config(
            options,
            root,
            poolings=[pooling],
            calibrators=["none", calibrator] if calibrator != "none" else ["none"],
            regimes=[options["regime"]],
            fit_sizes=sizes,
            command=_evaluate_command(options),
        )
        if options["regime"] == "per-set":
            from ..paper.perset import run_per_set

            per_set = run_per_set(config, progress=_progress(quiet))
            _publish(output, "evaluate", per_set.to_markdown(title="bertflow evaluate"), per_set.to_dict())
            return
        from ..paper.grid import run_grid

        result = run_grid(config, progress=_progress(quiet))
    _publish(output, "evaluate", result.to_markdown(title="bertflow evaluate", subsets=True), result.to_dict())


def _unless_default(command: Callable[..., Any], o: Mapping[str, Any], name: str) -> Any:
    """``o[name]`` for a command echo, or ``None`` (left out) where it equals ``command``'s default for it: the
    defaults are read from the command's signature, never re-typed."""
    return None if o[name] == inspect.signature(command).parameters[name].default else o[name]


def _tasks_echo(tasks: str) -> str | None:
    """``--tasks`` as the command echo shows it: omitted when it is the default (every task)."""
    return tasks if tasks != _ALL_TASKS else None


def _evaluate_command(o: dict[str, Any]) -> str:
    """The re-runnable ``bertflow evaluate`` line of a grid run (options at their defaults omitted)."""
    return _command(
        "evaluate",
        [
            ("--model", o["model"]),
            ("--pooling", o["pooling"]),
            ("--calibrator", o["calibrator"]),
            ("--regime", None if o["calibrator"] == "none" and o["regime"] != "per-set" else o["regime"]),
            ("--corpus", o["corpus"]),
            ("--column", o["column"]),
            ("--tasks", _tasks_echo(o["tasks"])),
            ("--seeds", _unless_default(evaluate, o, "seeds")),
            ("--epochs", _unless_default(evaluate, o, "epochs")),
            ("--fit-sizes", o["fit_sizes"]),
            ("--sample-seed", _unless_default(evaluate, o, "sample_seed")),
            ("--max-length", _unless_default(evaluate, o, "max_length")),
            ("--data-dir", o["data_dir"]),
            ("--threads", o["threads"]),
        ],
    )


def _grid_config(o: dict[str, Any], data_dir: Path, **grid: Any) -> Any:
    """The :class:`~bertflow.paper.grid.GridConfig` of a command's options ``o`` (its locals), the data folder found
    for it and the grid's own fields (``poolings``, ``calibrators``, ``regimes``, ``fit_sizes``, ``command``)."""
    from ..paper.grid import GridConfig

    corpus = o["corpus"]
    return GridConfig(
        model=o["model"],
        tasks=_split(o["tasks"]),
        seeds=o["seeds"],
        corpus=_corpus(corpus, o["column"], o["encoding_errors"]),
        corpus_name=corpus.name if corpus else None,
        max_length=o["max_length"],
        batch_size=o["batch_size"],
        device=o["device"],
        dtype=o["dtype"],
        data_dir=data_dir,
        cache_dir=o["cache_dir"],
        use_cache=not o["no_cache"],
        flow_epochs=o["epochs"],
        sample_seed=o["sample_seed"],
        **grid,
    )


def _publish(output: Path | None, stem: str, markdown: str, data: dict[str, Any]) -> None:
    """Write the report files (when ``output`` is given) and print the Markdown."""
    _write(output, stem, markdown, data)
    typer.echo(markdown, nl=False)


@app.command(
    epilog="""Examples:

  bertflow reproduce -o results                      (default grid on the embedded default model)

  bertflow reproduce --seeds 3 --poolings mean,cls,first-last-avg,last2avg --regimes target,train,nli -o results

  bertflow reproduce --model bert-base-uncased --poolings first-last-avg,mean -o bert-base   (prints the paper's rows)

  bertflow reproduce --model ../shared/models/bert-gutenberg-L6-H384 --paper-rows bert-base-uncased -o gutenberg

  bertflow reproduce --calibrators none,whitening,flow --regimes corpus --corpus wiki.txt -o wiki

  bertflow reproduce --regimes per-set --fit-sizes 100,300,1000 --calibrators none,whitening,flow --select lodo
"""
)
def reproduce(
    model: ModelOpt = None,
    poolings: PoolingsOpt = "mean,cls,first-last-avg",
    calibrators: CalibratorsOpt = None,
    regimes: RegimesOpt = "target,nli",
    fit_sizes: FitSizesOpt = None,
    sample_seed: SampleSeedOpt = 0,
    select: SelectOpt = None,
    corpus: CorpusOpt = None,
    column: ColumnOpt = None,
    tasks: TasksOpt = _ALL_TASKS,
    seeds: SeedsOpt = 1,
    epochs: EpochsOpt = 1.0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for reproduce.md and reproduce.json.")] = Path(
        "bertflow-reproduce"
    ),
    data_dir: DataDirOpt = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    max_length: MaxLenOpt = 64,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    encoding_errors: ErrorsOpt = EncodingErrors.strict,
    threads: ThreadsOpt = None,
    paper_rows: PaperRowsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Grid of pooling x calibrator x fitting regime on one model: Markdown + JSON, paper numbers beside BERT's."""
    options = dict(locals())
    _check_report(output, "reproduce")
    check_device(device)
    quiet_libraries()
    limit_threads(threads)
    regime_list = _split(regimes)
    if corpus is not None and "corpus" not in regime_list:
        regime_list.append("corpus")
    per_set = "per-set" in regime_list
    sizes = _fit_sizes(fit_sizes, per_set)
    if select is not None and (select != "lodo" or not per_set):
        _raise_input(f"--select takes 'lodo', with --regimes per-set (got --select {select!r}, --regimes {regimes})")
    config = _grid_config(
        options,
        find_data_dir(data_dir),
        # Inside the comma list a layer list is written with "+" ("mean,1+-1"); Pooling wants "1,-1".
        poolings=[p.replace("+", ",") for p in _split(poolings)],
        calibrators=_split(calibrators) if calibrators else None,
        regimes=regime_list,
        paper_rows=paper_rows,
        fit_sizes=sizes,
        command=_reproduce_command(options, regime_list),
    )
    if per_set:
        from ..paper.lodo import select_lodo
        from ..paper.perset import run_per_set

        per_set_result = run_per_set(config, progress=_progress(quiet))
        if select == "lodo":
            per_set_result.lodo = select_lodo(per_set_result)
        markdown, data = per_set_result.to_markdown(), per_set_result.to_dict()
    else:
        from ..paper.grid import run_grid

        result = run_grid(config, progress=_progress(quiet))
        markdown, data = result.to_markdown(), result.to_dict()
    _publish(output, "reproduce", markdown, data)
    if not quiet:
        typer.echo(f"wrote {output / 'reproduce.md'} and {output / 'reproduce.json'}", err=True)


def _reproduce_command(o: dict[str, Any], regimes: list[str]) -> str:
    """The re-runnable ``bertflow reproduce`` line (options at their defaults omitted)."""
    return _command(
        "reproduce",
        [
            ("--model", o["model"]),
            ("--poolings", o["poolings"]),
            ("--calibrators", o["calibrators"]),
            ("--regimes", ",".join(regimes)),
            ("--corpus", o["corpus"]),
            ("--column", o["column"]),
            ("--tasks", _tasks_echo(o["tasks"])),
            ("--fit-sizes", o["fit_sizes"]),
            ("--sample-seed", _unless_default(reproduce, o, "sample_seed")),
            ("--select", o["select"]),
            ("--seeds", o["seeds"]),
            ("--epochs", _unless_default(reproduce, o, "epochs")),
            ("--max-length", _unless_default(reproduce, o, "max_length")),
            ("--data-dir", o["data_dir"]),
            ("--threads", o["threads"]),
            ("--paper-rows", o["paper_rows"]),
            ("--output", o["output"]),
        ],
    )


@app.command(
    epilog="""Examples:

  bertflow analyze -o analysis                       (embedded default model, mean pooling, flow fitted on STS-B)

  bertflow analyze --calibrator whitening --regime nli -o analysis-white

  bertflow analyze --model-dir my-flow -o analysis-my-flow

  bertflow analyze --calibrator flow --compare whitening --vector pdf -o analysis-flow-vs-whitening
"""
)
def analyze(
    ctx: typer.Context,
    model_dir: ModelDirOpt = None,
    model: ModelOpt = None,
    pooling: PoolingOpt = "mean",
    calibrator: CalibratorOpt = "flow",
    regime: RegimeOpt = "target",
    corpus: CorpusOpt = None,
    column: ColumnOpt = None,
    seed: SeedOpt = 0,
    epochs: EpochsOpt = 1.0,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for analyze.md, analyze.json and the PNG plots.")
    ] = Path("bertflow-analyze"),
    plots: PlotsOpt = True,
    compare: ComparesOpt = None,
    vector: VectorOpt = None,
    data_dir: DataDirOpt = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    max_length: MaxLenOpt = 64,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    encoding_errors: ErrorsOpt = EncodingErrors.strict,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """The paper's analyses on STS-B: similarity vs edit distance (Table 6), anisotropy before/after, PNG plots."""
    options = {name: value for name, value in locals().items() if name != "ctx"}
    _check_report(output, "analyze")
    if plots:  # an optional dependency missing is said before the encoding and fitting, not after
        from ..paper.plots import require_matplotlib

        require_matplotlib()
    check_device(device)
    check_model_dir_options(ctx, model_dir)
    from ..paper.analyze import analyze_stsb

    quiet_libraries()
    limit_threads(threads)
    if corpus is not None and regime == "target":
        options["regime"] = regime = "corpus"
    root = find_data_dir(data_dir)
    if model_dir:
        embedder = load_embedder(model_dir, device, dtype)
        encoder, cal, label = embedder.encoder, embedder.calibrator, str(embedder.fit_info.get("regime", "unknown"))
        command = _command("analyze", [("--model-dir", model_dir), ("--data-dir", data_dir), ("--output", output)])
    else:
        from ..paper.grid import load_encoder

        encoder = load_encoder(model, pooling=pooling, max_length=max_length, device=device, dtype=dtype)
        cal, label, command = calibrator, regime, _analyze_command(options)
    result = analyze_stsb(
        encoder,
        calibrator=cal,
        regime=label,
        data_dir=root,
        corpus=_corpus(corpus, column, encoding_errors),
        corpus_name=corpus.name if corpus else None,
        seed=seed,
        flow_epochs=epochs,
        device=device,
        cache=_cache(cache_dir, no_cache),
        batch_size=batch_size,
        out_dir=output,
        plots=plots,
        vector=_split(vector) if vector else (),
        compare=_split(compare) if compare else (),
        command=command,
        progress=_progress(quiet),
    )
    typer.echo(result.to_markdown(), nl=False)
    if not quiet:
        typer.echo(f"wrote {output / 'analyze.md'}, {output / 'analyze.json'} and {len(result.plots)} plots", err=True)


def _analyze_command(o: dict[str, Any]) -> str:
    """The re-runnable ``bertflow analyze`` line of a model built from options (options at their defaults omitted)."""
    return _command(
        "analyze",
        [
            ("--model", o["model"]),
            ("--pooling", o["pooling"]),
            ("--calibrator", o["calibrator"]),
            ("--compare", o["compare"]),
            ("--regime", o["regime"]),
            ("--corpus", o["corpus"]),
            ("--column", o["column"]),
            ("--seed", o["seed"] if o["seed"] else None),
            ("--epochs", o["epochs"] if o["epochs"] != 1.0 else None),
            ("--max-length", o["max_length"] if o["max_length"] != 64 else None),
            ("--data-dir", o["data_dir"]),
            ("--threads", o["threads"]),
            ("--output", o["output"]),
            ("--no-plots", not o["plots"]),
            ("--vector", o["vector"]),
        ],
    )


@app.command("download-sts")
def download_sts_command(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Target folder (default ~/.cache/bertflow/sts).")
    ] = None,
    include_nli: Annotated[
        bool, typer.Option(metavar="", help="Also build NLI/snli_{dev,test}.tsv (about 90 MB).")
    ] = False,
    force: Annotated[bool, typer.Option(metavar="", help="Rebuild even if a previous download completed.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Download STS12-16, STS-B and SICK from the original releases into the TSV layout bertflow reads."""
    from ..evaluation.download import download_sts

    with progress_log("bertflow.evaluation.download", quiet):  # "downloading STS12 from ..." per archive, on stderr
        folder = download_sts(output, include_nli=include_nli, force=force)
    typer.echo(str(folder))
