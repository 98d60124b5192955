"""``bertflow evaluate``, ``bertflow reproduce``, ``bertflow analyze`` and ``bertflow download-sts``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from ..evaluation.datasets import STS_TASKS
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
        help="What the calibrator is fitted on: target (each task's own sentences, transductive) | train "
        "(STS-B/SICK-R train split) | nli (SNLI dev+test sentences) | corpus (--corpus FILE) | per-set (every "
        "STS12-16 subset, STS-B, SICK-R scored alone, each fitted on its own sentences; with --fit-sizes)."
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
DataDirOpt = Annotated[
    Path | None,
    typer.Option(help="STS data folder (default: $BERTFLOW_DATA_DIR, ./shared/data/sts, ../shared/data/sts, ...)."),
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


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


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
    _check_report(output, "evaluate")
    check_device(device)
    check_model_dir_options(ctx, model_dir)
    from ..evaluation.grid import GridConfig, evaluate_embedder, run_grid

    regime = regime.strip().lower()
    sizes = _fit_sizes(fit_sizes, regime == "per-set" and not model_dir)
    if regime == "per-set" and corpus is not None:
        _raise_input("--corpus has no role in the per-set regime: each set is fitted on its own sentences")
    quiet_libraries()
    limit_threads(threads)
    task_names = _split(tasks)
    if model_dir:
        command = _command(
            "evaluate",
            [("--model-dir", model_dir), ("--tasks", tasks if tasks != _ALL_TASKS else None), ("--data-dir", data_dir)],
        )
        result = evaluate_embedder(
            load_embedder(model_dir, device, dtype),
            task_names=task_names,
            data_dir=data_dir,
            cache=_cache(cache_dir, no_cache),
            batch_size=batch_size,
            command=command,
        )
    else:
        if corpus is not None and regime == "target":
            regime = "corpus"  # --corpus alone means: fit on it
        command = _command(
            "evaluate",
            [
                ("--model", model),
                ("--pooling", pooling),
                ("--calibrator", calibrator),
                ("--regime", None if calibrator == "none" and regime != "per-set" else regime),
                ("--corpus", corpus),
                ("--column", column),
                ("--tasks", tasks if tasks != _ALL_TASKS else None),
                ("--seeds", seeds if seeds != 1 else None),
                ("--epochs", epochs if epochs != 1.0 else None),
                ("--fit-sizes", fit_sizes),
                ("--sample-seed", sample_seed if sample_seed else None),
                ("--max-length", max_length if max_length != 64 else None),
                ("--data-dir", data_dir),
                ("--threads", threads),
            ],
        )
        config = GridConfig(
            model=model,
            poolings=[pooling],
            calibrators=["none", calibrator] if calibrator != "none" else ["none"],
            regimes=[regime],
            tasks=task_names,
            seeds=seeds,
            corpus=_corpus(corpus, column, encoding_errors),
            corpus_name=corpus.name if corpus else None,
            max_length=max_length,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            data_dir=data_dir,
            cache_dir=cache_dir,
            use_cache=not no_cache,
            flow_epochs=epochs,
            fit_sizes=sizes,
            sample_seed=sample_seed,
            command=command,
        )
        if regime == "per-set":
            from ..evaluation.perset import run_per_set

            per_set = run_per_set(config, progress=_progress(quiet))
            markdown = per_set.to_markdown(title="bertflow evaluate")
            _write(output, "evaluate", markdown, per_set.to_dict())
            typer.echo(markdown, nl=False)
            return
        result = run_grid(config, progress=_progress(quiet))
    markdown = result.to_markdown(title="bertflow evaluate", subsets=True)
    _write(output, "evaluate", markdown, result.to_dict())
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
    poolings: Annotated[
        str,
        typer.Option(
            help="Comma-separated poolings (layer lists joined by '+': 'mean,1+-1'); one encoder pass for all."
        ),
    ] = ("mean,cls,first-last-avg"),
    calibrators: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated calibrator specs; default: none, standard-norm, natsv-10, standard-norm+natsv-6, "
            "whitening, whitening-K (K = 256 for 768 dims, 384 for 1024, else D/3), flow, flow-paper."
        ),
    ] = None,
    regimes: Annotated[
        str,
        typer.Option(
            help="Comma-separated: target, train, nli, corpus; or per-set alone (every STS12-16 subset, STS-B, "
            "SICK-R scored on its own, each fitted on its own sentences: mean, worst set and count below raw)."
        ),
    ] = "target,nli",
    fit_sizes: FitSizesOpt = None,
    sample_seed: SampleSeedOpt = 0,
    select: Annotated[
        str | None,
        typer.Option(
            help="Regime per-set: 'lodo' adds the leave-one-dataset-out choice among the grid's configurations "
            "(picked on the other datasets, scored on the held-out one)."
        ),
    ] = None,
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
    paper_rows: Annotated[
        str | None,
        typer.Option(
            "--paper-rows",
            help="Show this paper model's published rows (bert-base-uncased or bert-large-uncased) beside another "
            "encoder's, captioned with how the two differ.",
        ),
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Grid of pooling x calibrator x fitting regime on one model: Markdown + JSON, paper numbers beside BERT's."""
    _check_report(output, "reproduce")
    check_device(device)
    from ..evaluation.grid import GridConfig, run_grid

    quiet_libraries()
    limit_threads(threads)
    regime_list = _split(regimes)
    if corpus is not None and "corpus" not in regime_list:
        regime_list.append("corpus")
    per_set = "per-set" in regime_list
    sizes = _fit_sizes(fit_sizes, per_set)
    if select is not None and (select != "lodo" or not per_set):
        _raise_input(f"--select takes 'lodo', with --regimes per-set (got --select {select!r}, --regimes {regimes})")
    command = _command(
        "reproduce",
        [
            ("--model", model),
            ("--poolings", poolings),
            ("--calibrators", calibrators),
            ("--regimes", ",".join(regime_list)),
            ("--corpus", corpus),
            ("--column", column),
            ("--tasks", tasks if tasks != _ALL_TASKS else None),
            ("--fit-sizes", fit_sizes),
            ("--sample-seed", sample_seed if sample_seed else None),
            ("--select", select),
            ("--seeds", seeds),
            ("--epochs", epochs if epochs != 1.0 else None),
            ("--max-length", max_length if max_length != 64 else None),
            ("--data-dir", data_dir),
            ("--threads", threads),
            ("--paper-rows", paper_rows),
            ("--output", output),
        ],
    )
    config = GridConfig(
        model=model,
        # Inside the comma list a layer list is written with "+" ("mean,1+-1"); Pooling wants "1,-1".
        poolings=[p.replace("+", ",") for p in _split(poolings)],
        calibrators=_split(calibrators) if calibrators else None,
        regimes=regime_list,
        tasks=_split(tasks),
        seeds=seeds,
        corpus=_corpus(corpus, column, encoding_errors),
        corpus_name=corpus.name if corpus else None,
        max_length=max_length,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        data_dir=data_dir,
        cache_dir=cache_dir,
        use_cache=not no_cache,
        flow_epochs=epochs,
        paper_rows=paper_rows,
        fit_sizes=sizes,
        sample_seed=sample_seed,
        command=command,
    )
    if per_set:
        from ..evaluation.lodo import select_lodo
        from ..evaluation.perset import run_per_set

        per_set_result = run_per_set(config, progress=_progress(quiet))
        if select == "lodo":
            per_set_result.lodo = select_lodo(per_set_result)
        markdown, data = per_set_result.to_markdown(), per_set_result.to_dict()
    else:
        result = run_grid(config, progress=_progress(quiet))
        markdown, data = result.to_markdown(), result.to_dict()
    _write(output, "reproduce", markdown, data)
    typer.echo(markdown, nl=False)
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
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for analyze.md, analyze.json and the PNG plots.")
    ] = Path("bertflow-analyze"),
    plots: Annotated[bool, typer.Option(metavar="", help="Draw the PNG plots (needs matplotlib).")] = True,
    compare: Annotated[
        str | None,
        typer.Option(help="Comma-separated calibrator specs fitted the same way and shown beside --calibrator."),
    ] = None,
    vector: Annotated[
        str | None, typer.Option(help="Also write each plot as pdf and/or svg (comma-separated).")
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
    """The paper's analyses on STS-B: similarity vs edit distance (Table 6), anisotropy before/after, PNG plots."""
    _check_report(output, "analyze")
    if plots:  # an optional dependency missing is said before the encoding and fitting, not after
        from ..evaluation.plots import require_matplotlib

        require_matplotlib()
    check_device(device)
    check_model_dir_options(ctx, model_dir)
    from ..evaluation.analyze import analyze_stsb

    quiet_libraries()
    limit_threads(threads)
    if corpus is not None and regime == "target":
        regime = "corpus"
    if model_dir:
        embedder = load_embedder(model_dir, device, dtype)
        encoder, cal, label = embedder.encoder, embedder.calibrator, str(embedder.fit_info.get("regime", "unknown"))
        command = _command("analyze", [("--model-dir", model_dir), ("--data-dir", data_dir), ("--output", output)])
    else:
        from ..evaluation.grid import load_encoder

        encoder = load_encoder(model, pooling=pooling, max_length=max_length, device=device, dtype=dtype)
        cal, label = calibrator, regime
        command = _command(
            "analyze",
            [
                ("--model", model),
                ("--pooling", pooling),
                ("--calibrator", calibrator),
                ("--compare", compare),
                ("--regime", regime),
                ("--corpus", corpus),
                ("--column", column),
                ("--seed", seed if seed else None),
                ("--epochs", epochs if epochs != 1.0 else None),
                ("--max-length", max_length if max_length != 64 else None),
                ("--data-dir", data_dir),
                ("--threads", threads),
                ("--output", output),
                ("--no-plots", not plots),
                ("--vector", vector),
            ],
        )
    result = analyze_stsb(
        encoder,
        calibrator=cal,
        regime=label,
        data_dir=data_dir,
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
