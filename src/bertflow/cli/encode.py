"""``bertflow encode``: embed a text file, a TSV column or a Parquet / Arrow table into ``.npy`` or a table."""

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
    ColumnOpt,
    DeviceOpt,
    DtypeOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelDirOpt,
    ModelOpt,
    OverwriteFileOpt,
    PoolingOpt,
    QuietOpt,
    TextColumnOpt,
    ThreadsOpt,
    announce,
    build_encoder,
    check_input_file,
    check_model_dir_options,
    load_embedder,
    model_label,
    quiet_libraries,
    read_corpus,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator


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

            ids, id_field = (table.read_ids, table.id_field()) if id_column else (None, None)
            row = write_embedding_file(output, out_kind, dim, parts, ids=ids, id_field=id_field)
        else:
            row = _write_npy(output, input, parts, n, dim)
    typer.echo(json.dumps({"output": str(output), "rows": row, "dim": dim}), err=to_stdout)


def _input_stream(source: Path, table: Any, column: list[str] | None, errors: str) -> tuple[int | None, Iterator[str]]:
    """``encode``'s sentences as ``(count, stream)``: a table's column, a TSV's columns, or a text file's non-blank
    lines (counted and checked in a first pass where the file can be read twice; ``None`` for a pipe)."""
    if table is not None:
        from ..io.arrow import iter_table_sentences

        return table.check(), iter_table_sentences(table)
    if column:
        sentences = read_corpus(source, column, errors, False)
        return len(sentences), iter(sentences)
    if str(source) != STDIO and source.is_file():
        # A regular file can be read twice: a first pass counts rows and finds bad lines before any encoding work.
        return sum(1 for _ in _nonblank_lines(source, errors)), _nonblank_lines(source, errors)
    # A pipe, FIFO or terminal can be read only once: stream it, and write the row count into the header last.
    return None, _nonblank_lines(source, errors)


def _write_npy(output: Path, source: Path, parts: Iterable[np.ndarray], n: int | None, dim: int) -> int:
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
            raise InputError(f"{source} changed while it was being encoded ({n} lines counted, {row} encoded)")
        out.seek(0)
        out.write(embeddings_npy_header(row, dim))
        if to_stdout:
            out.seek(0)
            shutil.copyfileobj(out, sys.stdout.buffer)
            sys.stdout.buffer.flush()
    return row


def _table_options(
    source: Path, output: Path, column: list[str] | None, text_column: str | None, id_column: str | None
) -> tuple[Any, str]:
    """``encode``'s table input (a :class:`~bertflow.io.arrow.TableColumn`, or None for text) and output kind
    (``"npy"``, ``"parquet"`` or ``"arrow"``, from the suffix), refusing options that do not fit them."""
    from ..errors import InputError
    from ..io.arrow import DEFAULT_TEXT_COLUMN, TABLE_SUFFIXES, TableColumn, input_format

    in_kind = input_format(source)
    out_kind = "npy" if str(output) == STDIO else TABLE_SUFFIXES.get(output.suffix.lower(), "npy")
    if in_kind == "text" and (text_column or id_column):
        raise InputError(f"--text-column and --id-column apply to a .parquet / .arrow input; {source} is read as text")
    if in_kind != "text" and column:
        raise InputError(f"--column is for a TSV input; name the text column of {source} with --text-column")
    if id_column and out_kind == "npy":
        raise InputError("--id-column needs a table output (-o x.parquet or x.arrow): a .npy holds only vectors")
    table = TableColumn(source, text_column or DEFAULT_TEXT_COLUMN, in_kind, id_column) if in_kind != "text" else None
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
