"""``bertflow evaluate``, ``bertflow reproduce``, ``bertflow analyze`` and ``bertflow download-sts``."""

from __future__ import annotations

import inspect
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..errors import DataNotFoundError, InputError
from ..evaluation.datasets import DATA_DIR_ENV, DEFAULT_CACHE_DIR, HOW_TO_GET_DATA, STS_TASKS, resolve_data_dir
from ..paper.published import PAPER_MODELS
from ..paper.regimes import REGIME_TEXT, REGIMES
from ._app import app
from .options import (
    BatchOpt,
    CalibratorOpt,
    ColumnOpt,
    DeviceOpt,
    DtypeOpt,
    EpochsOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelDirOpt,
    ModelOpt,
    PoolingOpt,
    QuietOpt,
    SeedOpt,
    ThreadsOpt,
    build_encoder,
    check_model_dir_options,
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
    Literal["lodo"] | None,
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


def _output(text: str) -> Any:
    return typer.Option("--output", "-o", help=text)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def find_data_dir(data_dir: Path | None) -> Path:
    """The STS data folder of a command: ``--data-dir`` if given, else ``$BERTFLOW_DATA_DIR``, else the first
    existing of :data:`DATA_DIR_CANDIDATES`; absolute. DataNotFoundError, saying how to point at a local copy and
    how to download the data, when the named folder or every default is missing."""
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


#: Options a report's command line leaves out: how the run is done and where it is shown, not what it measures.
NOT_ECHOED = ("ctx", "cache_dir", "no_cache", "batch_size", "device", "dtype", "encoding_errors", "quiet")


def echo_command(command: Callable[..., Any], options: Mapping[str, Any]) -> str:
    """The re-runnable ``bertflow <command>`` line of ``options`` (the command's arguments): every option that
    differs from its default, in the command's order, but :data:`NOT_ECHOED`. The defaults are read from the
    command's signature, never re-typed."""
    parts = ["bertflow", command.__name__]
    for name, param in inspect.signature(command).parameters.items():
        value = None if name in NOT_ECHOED else options[name]
        if value is None or value == param.default:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            parts += [str(v) for item in (value if isinstance(value, list) else [value]) for v in (flag, item)]
    return shlex.join(parts)


def _fit_sizes(text: str | None, per_set: bool) -> list[int]:
    """``--fit-sizes 100,300,1000`` as integers, checked before any work (only with the per-set regime)."""
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


def _corpus(corpus: Path | None, column: list[str] | None, errors: str) -> list[str] | None:
    return read_corpus(corpus, column, errors, True) if corpus is not None else None


def _check_report(output: Path | None, stem: str) -> None:
    """Before any work: the report files ``OUTPUT/STEM.md`` and ``.json`` can be written (only they are replaced)."""
    from ..io.files import check_output_file

    if output is not None:
        for suffix in (".md", ".json"):  # OutputError where output is a file, too
            check_output_file(output / f"{stem}{suffix}", create_parents=True)


def _publish(output: Path | None, stem: str, result: Any) -> None:
    """Write the report of a grid or per-set ``result`` as ``OUTPUT/STEM.md`` and ``.json`` (when ``output`` is
    given) and print the Markdown (``bertflow evaluate`` adds the per-subset tables of a grid)."""
    from ..paper.render import render_grid, render_per_set, write_report
    from ..paper.results import PerSetResult

    title = f"bertflow {stem}"
    if isinstance(result, PerSetResult):
        markdown = render_per_set(result, title=title)
    else:
        markdown = render_grid(result, title=title, subsets=stem == "evaluate")
    if output is not None:
        write_report(output, stem, markdown, result.to_dict())
    typer.echo(markdown, nl=False)


def _grid_config(o: dict[str, Any], data_dir: Path, **grid: Any) -> Any:
    """The :class:`~bertflow.paper.grid.GridConfig` of a command's options ``o`` (its arguments), the data folder
    found for it and the grid's own fields (``poolings``, ``calibrators``, ``regimes``, ``fit_sizes``, ``command``)."""
    from ..paper.grid import GridConfig

    corpus = o["corpus"]
    return GridConfig(
        model=o["model"], tasks=_split(o["tasks"]), seeds=o["seeds"],
        corpus=_corpus(corpus, o["column"], o["encoding_errors"]), corpus_name=corpus.name if corpus else None,
        max_length=o["max_length"], batch_size=o["batch_size"], device=o["device"], dtype=o["dtype"],
        data_dir=data_dir, cache_dir=o["cache_dir"], use_cache=not o["no_cache"], flow_epochs=o["epochs"],
        sample_seed=o["sample_seed"], **grid,
    )  # fmt: skip


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
    output: Annotated[Path | None, _output("Folder for evaluate.md and evaluate.json.")] = None,
    data_dir: DataDirOpt = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    max_length: MaxLenOpt = 64,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    encoding_errors: ErrorsOpt = "strict",
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """STS evaluation (Spearman x100, "all" and "wmean", per subset) of an encoder + calibrator, with its regime."""
    options = {name: value for name, value in locals().items() if name != "ctx"}
    _check_report(output, "evaluate")
    check_model_dir_options(ctx, model_dir)
    regime = options["regime"] = regime.strip().lower()
    sizes = _fit_sizes(fit_sizes, regime == "per-set" and not model_dir)
    if regime == "per-set" and corpus is not None:
        raise InputError("--corpus has no role in the per-set regime: each set is fitted on its own sentences")
    quiet_libraries(threads)
    root = find_data_dir(data_dir)
    if corpus is not None and regime == "target":
        options["regime"] = "corpus"  # --corpus alone means: fit on it
    command = echo_command(evaluate, options)
    if model_dir:
        from ..paper.grid import evaluate_embedder

        embedder = load_embedder(model_dir, device, dtype)
        result = evaluate_embedder(embedder, task_names=_split(tasks), data_dir=root, cache=_cache(cache_dir, no_cache),
                                   batch_size=batch_size, command=command)  # fmt: skip
        _publish(output, "evaluate", result)
        return
    calibrators = ["none", calibrator] if calibrator != "none" else ["none"]
    config = _grid_config(options, root, poolings=[pooling], calibrators=calibrators, regimes=[options["regime"]],
                          fit_sizes=sizes, command=command)  # fmt: skip
    _publish(output, "evaluate", _run(config, None, _progress(quiet)))


def _run(config: Any, select: str | None, progress: Any) -> Any:
    """Run the grid, or the per-set protocol (with the ``lodo`` selection when ``select`` says so)."""
    if "per-set" not in config.regimes:
        from ..paper.grid import run_grid

        return run_grid(config, progress=progress)
    from ..paper.lodo import select_lodo
    from ..paper.perset import run_per_set

    per_set = run_per_set(config, progress=progress)
    if select == "lodo":
        per_set.lodo = select_lodo(per_set)
    return per_set


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
    output: Annotated[Path, _output("Folder for reproduce.md and reproduce.json.")] = Path("bertflow-reproduce"),
    data_dir: DataDirOpt = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    max_length: MaxLenOpt = 64,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    encoding_errors: ErrorsOpt = "strict",
    threads: ThreadsOpt = None,
    paper_rows: PaperRowsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Grid of pooling x calibrator x fitting regime on one model: Markdown + JSON, paper numbers beside BERT's."""
    options = dict(locals())
    _check_report(output, "reproduce")
    quiet_libraries(threads)
    regime_list = _split(regimes)
    if corpus is not None and "corpus" not in regime_list:
        regime_list.append("corpus")
    per_set = "per-set" in regime_list
    sizes = _fit_sizes(fit_sizes, per_set)
    if select is not None and not per_set:
        raise InputError(f"--select lodo goes with --regimes per-set (got --regimes {regimes})")
    config = _grid_config(
        options,
        find_data_dir(data_dir),
        # Inside the comma list a layer list is written with "+" ("mean,1+-1"); Pooling wants "1,-1".
        poolings=[p.replace("+", ",") for p in _split(poolings)],
        calibrators=_split(calibrators) if calibrators else None,
        regimes=regime_list,
        paper_rows=paper_rows,
        fit_sizes=sizes,
        command=echo_command(reproduce, options),
    )
    _publish(output, "reproduce", _run(config, select, _progress(quiet)))
    if not quiet:
        typer.echo(f"wrote {output / 'reproduce.md'} and {output / 'reproduce.json'}", err=True)


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
    output: Annotated[Path, _output("Folder for analyze.md, analyze.json and the PNG plots.")] = Path(
        "bertflow-analyze"
    ),
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
    encoding_errors: ErrorsOpt = "strict",
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """The paper's analyses on STS-B: similarity vs edit distance (Table 6), anisotropy before/after, PNG plots."""
    options = {name: value for name, value in locals().items() if name != "ctx"}
    _check_report(output, "analyze")
    if plots:  # an optional dependency missing is said before the encoding and fitting, not after
        from ..paper.plots import require_matplotlib

        require_matplotlib()
    check_model_dir_options(ctx, model_dir)
    from ..paper.analyze import analyze_stsb
    from ..paper.render import render_analysis

    quiet_libraries(threads)
    if corpus is not None and regime == "target":
        options["regime"] = regime = "corpus"
    root = find_data_dir(data_dir)
    if model_dir:
        embedder = load_embedder(model_dir, device, dtype)
        encoder, cal, label = embedder.encoder, embedder.calibrator, str(embedder.fit_info.get("regime", "unknown"))
    else:
        encoder = build_encoder(model, pooling, max_length, device, dtype)
        cal, label = calibrator, regime
    result = analyze_stsb(
        encoder, calibrator=cal, regime=label, data_dir=root, corpus=_corpus(corpus, column, encoding_errors),
        corpus_name=corpus.name if corpus else None, seed=seed, flow_epochs=epochs, device=device,
        cache=_cache(cache_dir, no_cache), batch_size=batch_size, out_dir=output, plots=plots,
        vector=_split(vector) if vector else (), compare=_split(compare) if compare else (),
        command=echo_command(analyze, options), progress=_progress(quiet),
    )  # fmt: skip
    typer.echo(render_analysis(result), nl=False)
    if not quiet:
        typer.echo(f"wrote {output / 'analyze.md'}, {output / 'analyze.json'} and {len(result.plots)} plots", err=True)


@app.command("download-sts")
def download_sts_command(
    output: Annotated[Path | None, _output("Target folder (default ~/.cache/bertflow/sts).")] = None,
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
