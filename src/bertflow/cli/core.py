"""``bertflow fit``, ``bertflow encode`` and ``bertflow similarity``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer

from ._app import app
from .options import (
    STDIO,
    BatchOpt,
    CalibratorOpt,
    ColumnOpt,
    CorpusArg,
    DeviceOpt,
    DtypeOpt,
    EpochsOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelDirOpt,
    ModelOpt,
    OverwriteFileOpt,
    OverwriteOpt,
    PoolingOpt,
    QuietOpt,
    SeedOpt,
    TextColumnOpt,
    ThreadsOpt,
    TokenSourceOpt,
    TokenStatsOpt,
    ValidationFractionOpt,
    WeightingOpt,
    announce,
    build_encoder,
    check_input_file,
    check_model_dir_options,
    check_text_arguments,
    fit_summary,
    load_embedder,
    model_label,
    quiet_libraries,
    read_corpus,
    weighted_pooling,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from ..comparison import ModelComparison, PairScores


@app.command(
    epilog="""Examples:

  bertflow fit corpus.txt -o my-flow

  bertflow fit ../shared/data/sts/STSBenchmark/train.tsv -c sentence1 -c sentence2 -o stsb-flow

  bertflow fit corpus.txt -o white --calibrator whitening-256 --pooling first-last-avg

  zcat corpus.txt.gz | bertflow fit - -o my-flow      (- reads standard input)
"""
)
def fit(
    corpus: CorpusArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the fitted model to.")],
    model: ModelOpt = None,
    pooling: PoolingOpt = "mean",
    weighting: WeightingOpt = None,
    token_stats: TokenStatsOpt = None,
    token_source: TokenSourceOpt = None,
    max_length: MaxLenOpt = 64,
    calibrator: CalibratorOpt = "flow",
    column: ColumnOpt = None,
    unique: Annotated[bool, typer.Option(metavar="", help="Drop duplicate sentences before fitting.")] = False,
    seed: SeedOpt = 0,
    epochs: EpochsOpt = 1.0,
    validation_fraction: ValidationFractionOpt = 0.0,
    encoding_errors: ErrorsOpt = "strict",
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    overwrite: OverwriteOpt = False,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Fit a calibrator on unlabeled sentences and save encoder reference + calibrator to a folder."""
    from ..calibrators import parse_calibrator
    from ..embedder import Embedder
    from ..io.files import check_output_folder
    from ..validation import check_epochs

    # Every option is checked before the corpus is read and the encoder loaded, so none fails after the fit.
    inputs = [corpus, *([model] if model else []), *([token_stats] if token_stats else [])]
    check_output_folder(output, "model", overwrite=overwrite, inputs=inputs)
    pooling = weighted_pooling(pooling, weighting)
    check_epochs(epochs)
    cal = parse_calibrator(
        calibrator, seed=seed, epochs=epochs, validation_fraction=validation_fraction, device=device, verbose=not quiet
    )
    quiet_libraries(threads)
    sentences = read_corpus(corpus, column, encoding_errors, unique)
    token_corpus = read_corpus(token_stats, None, encoding_errors, False) if token_stats else None
    encoder = build_encoder(model, pooling, max_length, device, dtype)
    embedder = Embedder(encoder, cal).fit(
        sentences,
        batch_size=batch_size,
        show_progress_bar=not quiet,
        regime="corpus <stdin>" if str(corpus) == STDIO else f"corpus {corpus.name}",
        token_corpus=token_corpus,
        token_source=token_source,  # type: ignore[arg-type]  # checked by Embedder.fit
    )
    embedder.save(output, overwrite=overwrite)
    typer.echo(fit_summary(output, len(sentences), cal, embedder.fit_info["seconds"]))


@app.command(
    epilog="""Examples:

  bertflow encode sentences.txt -o vectors.npy --model-dir my-flow

  bertflow encode sentences.txt -o raw.npy --pooling cls      (raw encoder, no calibrator)

  bertflow encode data.parquet --text-column text --id-column doc_id -o vectors.parquet --model-dir my-flow

Input: a text file, a TSV with --column, or a Parquet / Arrow (.parquet, .arrow, .feather) table with
--text-column. Output by suffix: .npy, or a .parquet / .arrow table (row, the --id-column if any, embedding).
"""
)
def encode(
    ctx: typer.Context,
    input: Annotated[
        Path,
        typer.Argument(
            help="Text file, one sentence per line, a TSV with --column, or a .parquet / .arrow table; - reads "
            "standard input (text).",
            callback=check_input_file,
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the float32 [N, D] vectors: .npy, .parquet or .arrow (a table with a row column, "
            "the --id-column and an embedding column); - writes a .npy to standard output.",
        ),
    ],
    model_dir: ModelDirOpt = None,
    model: ModelOpt = None,
    pooling: PoolingOpt = "mean",
    max_length: MaxLenOpt = 64,
    column: ColumnOpt = None,
    text_column: TextColumnOpt = None,
    id_column: Annotated[
        str | None, typer.Option(help="A Parquet / Arrow input column copied beside each embedding (table output).")
    ] = None,
    encoding_errors: ErrorsOpt = "strict",
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    overwrite: OverwriteFileOpt = False,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Embed every line (or table row) of a file into a .npy, .parquet or .arrow (streamed: memory stays bounded
    for any file size)."""
    to_stdout = str(output) == STDIO
    if not to_stdout:
        from ..io.files import check_output_file

        check_output_file(output, inputs=[input, *([model_dir] if model_dir else [])], overwrite=overwrite)
    table, out_kind = _table_options(input, output, column, text_column, id_column)
    check_model_dir_options(ctx, model_dir)
    announce(f"loading {model_label([model_dir] if model_dir else [], model)} ...", quiet)
    from tqdm.auto import tqdm

    from ..embedder import iter_calibrated

    quiet_libraries(threads)
    if model_dir:
        embedder = load_embedder(model_dir, device, dtype)
        encoder, calibrator = embedder.encoder, embedder.calibrator
    else:
        encoder, calibrator = build_encoder(model, pooling, max_length, device, dtype), None
    n, stream = _input_stream(input, table, column, encoding_errors)
    dim = calibrator.n_features_out_ if calibrator is not None else encoder.dim
    with tqdm(total=n, desc="encode", unit="sent", disable=quiet) as bar:  # on stderr, out of n where known
        # Calibrated on the device, checked once there (NaN, Inf, overflow), as Embedder.encode does.
        parts = iter_calibrated(encoder, calibrator, stream, batch_size=batch_size, progress=bar.update)
        if out_kind != "npy":
            from ..io.arrow import write_embedding_file

            ids = table.read_ids if id_column else None
            id_field = table.id_field() if id_column else None
            row = write_embedding_file(output, out_kind, dim, parts, ids=ids, id_field=id_field)
        else:
            row = _write_npy(output, input, parts, n, dim)
    typer.echo(json.dumps({"output": str(output), "rows": row, "dim": dim}), err=to_stdout)


def _input_stream(input: Path, table: Any, column: list[str] | None, errors: str) -> tuple[int | None, Iterator[str]]:  # noqa: A002
    """``encode``'s sentences as ``(count, stream)``: a table's column, a TSV's columns, or a text file's non-blank
    lines (counted and checked in a first pass where the file can be read twice; ``None`` for a pipe)."""
    if table is not None:
        from ..io.arrow import iter_table_sentences

        return table.check(), iter_table_sentences(table)
    if column:
        sentences = read_corpus(input, column, errors, False)
        return len(sentences), iter(sentences)
    if str(input) != STDIO and input.is_file():
        # A regular file can be read twice: a first pass counts rows and finds bad lines before any encoding work.
        return sum(1 for _ in _nonblank_lines(input, errors)), _nonblank_lines(input, errors)
    # A pipe, FIFO or terminal can be read only once: stream it, and write the row count into the header last.
    return None, _nonblank_lines(input, errors)


def _write_npy(output: Path, input: Path, parts: Iterable[np.ndarray], n: int | None, dim: int) -> int:  # noqa: A002
    """Write the float32 [N, ``dim``] ``parts`` as one .npy at ``output`` (``-``: standard output); return N.
    Plain appends, so memory stays at one chunk. InputError when ``n`` rows were counted but another number came."""
    import shutil
    import sys
    import tempfile

    from ..errors import InputError
    from ..io.files import atomic_file, embeddings_npy_header

    to_stdout = str(output) == STDIO
    # A seekable file: output written atomically, or (-) a spool copied to standard output at the end.
    with tempfile.TemporaryFile() if to_stdout else atomic_file(output, "wb") as out:
        out.write(embeddings_npy_header(n or 0, dim))
        row = 0
        for part in parts:
            out.write(np.ascontiguousarray(part, dtype=np.float32).tobytes())
            row += len(part)
        if n is not None and row != n:
            raise InputError(f"{input} changed while it was being encoded ({n} lines counted, {row} encoded)")
        out.seek(0)
        out.write(embeddings_npy_header(row, dim))
        if to_stdout:
            out.seek(0)
            shutil.copyfileobj(out, sys.stdout.buffer)
            sys.stdout.buffer.flush()
    return row


def _table_options(
    input: Path,  # noqa: A002 - the command's own argument name
    output: Path,
    column: list[str] | None,
    text_column: str | None,
    id_column: str | None,
) -> tuple[Any, str]:
    """``encode``'s table input (a :class:`~bertflow.io.arrow.TableColumn`, or None for text) and output kind
    (``"npy"``, ``"parquet"`` or ``"arrow"``, from the suffix), refusing options that do not fit them."""
    from ..errors import InputError
    from ..io.arrow import DEFAULT_TEXT_COLUMN, TABLE_SUFFIXES, TableColumn, input_format

    in_kind = input_format(input)
    out_kind = "npy" if str(output) == STDIO else TABLE_SUFFIXES.get(output.suffix.lower(), "npy")
    if in_kind == "text" and (text_column or id_column):
        raise InputError(f"--text-column and --id-column apply to a .parquet / .arrow input; {input} is read as text")
    if in_kind != "text" and column:
        raise InputError(f"--column is for a TSV input; name the text column of {input} with --text-column")
    if id_column and out_kind == "npy":
        raise InputError("--id-column needs a table output (-o x.parquet or x.arrow): a .npy holds only vectors")
    table = TableColumn(input, text_column or DEFAULT_TEXT_COLUMN, in_kind, id_column) if in_kind != "text" else None
    return table, out_kind


def _nonblank_lines(path: Path, errors: str):
    """Lines of ``path``; a blank line is an error naming it, since the output keeps one row per line."""
    from ..errors import InputError
    from ..io.text import iter_lines
    from ..validation import is_blank

    for number, text in iter_lines(path, errors=errors):
        if is_blank(text):  # the readers' one blank rule: whitespace, zero-width characters, U+FEFF, NUL
            raise InputError(
                f"{path}: line {number} is blank; `bertflow encode` writes one row per input line, "
                "so remove blank lines first (e.g. grep -v '^[[:space:]]*$')"
            )
        yield text


@app.command(
    epilog="""Examples:

  bertflow similarity "A man plays a guitar." "Someone plays music." --model-dir my-flow

  bertflow similarity --pairs pairs.tsv --model-dir my-flow -o scores.tsv

  bertflow similarity --pairs pairs.tsv --model-dir stsb-flow --model-dir stsb-auto -o scores.tsv
      (one column per model, cosine:stsb-flow and cosine:stsb-auto; one encoder pass)
"""
)
def similarity(
    ctx: typer.Context,
    sentences: Annotated[list[str] | None, typer.Argument(help="Two sentences to compare.")] = None,
    pairs: Annotated[
        Path | None,
        typer.Option(
            help="TSV with a header holding sentence1 and sentence2 columns; other columns (score, id ...) are "
            "optional and copied to the output after the cosine. - reads standard input.",
            callback=check_input_file,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="With --pairs: write the TSV with a cosine column (one per model) here (default or -: stdout).",
        ),
    ] = None,
    model_dir: Annotated[
        list[str] | None,
        typer.Option(
            help="A folder written by `bertflow fit` (or a hub id): its encoder and fitted calibrator replace "
            "--model, --pooling and the other model options. Repeat it to compare models fitted on the same "
            "encoder and max_length (poolings may differ): one cosine:NAME column each, from one encoder pass."
        ),
    ] = None,
    model: ModelOpt = None,
    pooling: PoolingOpt = "mean",
    max_length: MaxLenOpt = 64,
    encoding_errors: ErrorsOpt = "strict",
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    overwrite: OverwriteFileOpt = False,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Cosine similarity in the calibrated space: of two sentences, or of every pair in a TSV (raw encoder and one
    or several fitted models side by side)."""
    from ..io.files import atomic_write_text
    from ..io.text import read_pairs

    model_dirs = model_dir or []
    output = _check_similarity_inputs(sentences, pairs, output, overwrite)
    check_model_dir_options(ctx, ", ".join(model_dirs))
    # Every check above is cheap; what follows (torch, transformers, the weights and their fingerprint) takes seconds.
    announce(f"loading {model_label(model_dirs, model)} ...", quiet)
    from ..comparison import ModelComparison

    quiet_libraries(threads)
    if len(model_dirs) == 1 and sentences:
        embedder = load_embedder(model_dirs[0], device, dtype)
        typer.echo(f"{float(embedder.similarity(sentences[0], sentences[1])):.6f}")
        return
    if model_dirs:
        comparison = ModelComparison.load(model_dirs, device=device, dtype=dtype)
    else:
        comparison = ModelComparison(build_encoder(model, pooling, max_length, device, dtype))
    if sentences:  # several models, or the raw encoder
        scores = comparison.score_pairs([sentences[0]], [sentences[1]], show_progress_bar=False)
        for name, cos in (scores.calibrated or scores.raw).items():
            typer.echo(f"{cos[0]:.6f}" if len(model_dirs) < 2 else f"{cos[0]:.6f}\t{name}")
        return
    data = read_pairs(pairs, errors=encoding_errors, require_target=False, keep_columns=True)
    # A bar on stderr for any file (a few hundred pairs take seconds on CPU), none with -q. Raw and calibrated
    # cosines come from the same pass (no second, silent encoding).
    result = comparison.score_pairs(data.sentences1, data.sentences2, show_progress_bar=not quiet)
    text = _pairs_tsv(result.calibrated or result.raw, data.columns or {})
    if output:
        atomic_write_text(output, text)
    else:
        typer.echo(text, nl=False)
    if data.scores is not None:
        typer.echo(_spearman_line(comparison, result, data.scores), err=True)


def _check_similarity_inputs(
    sentences: list[str] | None, pairs: Path | None, output: Path | None, overwrite: bool
) -> Path | None:
    """``similarity``'s checks before anything loads: two sentences or ``--pairs`` (not both), a readable pairs
    file, an output file that may be written. Returns the output file, ``None`` for standard output (``-``)."""
    from ..errors import InputError
    from ..io.files import check_output_file

    if (pairs is None) == (not sentences):
        raise InputError("give either two sentences or --pairs FILE")
    if sentences:
        if len(sentences) != 2:
            raise InputError(f"similarity takes exactly two sentences, got {len(sentences)}")
        check_text_arguments(sentences)
    if output is None or str(output) == STDIO:
        return None
    check_output_file(output, inputs=[pairs] if pairs is not None else [], overwrite=overwrite)
    return output


def _pairs_tsv(cosines: dict[str, Sequence[float]], columns: dict[str, Sequence[str]]) -> str:
    """The TSV ``similarity --pairs`` writes: one cosine column per model (6 decimals), then the input's columns,
    every one and in its order (ids and scores travel with their pair)."""
    from ..io.files import PAIRS_TSV_FIRST_COLUMN

    # One column per model: "cosine" alone for one model or the raw encoder (so scripts and the "bertflow wrote
    # this file" rule of io/files.py see the same file as ever), "cosine:NAME" for several.
    names = [PAIRS_TSV_FIRST_COLUMN] if len(cosines) == 1 else [f"{PAIRS_TSV_FIRST_COLUMN}:{name}" for name in cosines]
    lines = ["\t".join([*names, *columns])]
    lines += [
        "\t".join([*(f"{c:.6f}" for c in row[: len(names)]), *row[len(names) :]])
        for row in zip(*cosines.values(), *columns.values(), strict=True)
    ]
    return "\n".join(lines) + "\n"


def _spearman_line(comparison: ModelComparison, result: PairScores, gold: Sequence[float]) -> str:
    """``spearman x100 against the score column (N pairs): raw POOLING r | CALIBRATOR (NAME) r | ...``: each raw
    pooling once, then each model."""
    from scipy.stats import spearmanr

    parts = [f"{label} {spearmanr(cos, gold).statistic * 100:.2f}" for label, cos in result.raw.items()]
    parts += [f"{m.label} {spearmanr(result.calibrated[m.name], gold).statistic * 100:.2f}" for m in comparison.models]
    return f"spearman x100 against the score column ({len(gold)} pairs): " + " | ".join(parts)
