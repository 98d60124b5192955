"""``bertflow fit``: fit a calibrator on unlabeled sentences and save the model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    ModelOpt,
    OverwriteOpt,
    PoolingOpt,
    QuietOpt,
    SeedOpt,
    ThreadsOpt,
    TokenSourceOpt,
    TokenStatsOpt,
    ValidationFractionOpt,
    WeightingOpt,
    build_encoder,
    fit_summary,
    quiet_libraries,
    read_corpus,
    weighted_pooling,
)


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
