"""``bertflow similarity``: the cosine of two sentences, or of every pair of a TSV, for one or more models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ._app import app
from .options import (
    STDIO,
    DeviceOpt,
    DtypeOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelOpt,
    OverwriteFileOpt,
    PoolingOpt,
    QuietOpt,
    ThreadsOpt,
    announce,
    build_encoder,
    check_input_file,
    check_model_dir_options,
    check_text_arguments,
    load_embedder,
    model_label,
    quiet_libraries,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..comparison import ModelComparison, PairScores


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
