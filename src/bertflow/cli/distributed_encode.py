"""``bertflow distributed-encode``: encode a text file or a table's text column into a sharded, resumable store on
every rank (:mod:`.ranks` runs the ranks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ._app import app
from .options import (
    BackendOpt,
    BatchOpt,
    DevicesOpt,
    DtypeOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelDirOpt,
    ModelOpt,
    PoolingOpt,
    QuietOpt,
    RankDeviceOpt,
    TextColumnOpt,
    TimeoutOpt,
    build_encoder,
    load_embedder,
    source_constant,
)
from .ranks import run_on_ranks

_EPILOG_ENCODE = """Examples:

  bertflow distributed-encode corpus.txt -o emb --model bert-base-uncased --pooling first-last-avg

  torchrun --nproc_per_node=8 -m bertflow distributed-encode corpus.txt -o emb --model-dir my-flow

  bertflow distributed-encode corpus.txt -o emb --devices cuda:0,cuda:1      (no torchrun, one machine)

  bertflow distributed-encode docs.parquet --text-column body --id-column doc_id --format parquet -o emb

Re-running the same command resumes: finished shards are kept. Read the result with
bertflow.scale.reader.open_embeddings("emb"), or pass --merge for one emb/embeddings.npy. See docs/distributed.md.
"""

#: How distributed-encode reads its input (default: from the suffix), and the file format and size of a store's shards.
_INPUT_FORMATS = ("text", *source_constant("io/arrow", "TABLE_FORMATS"))
_SHARD_FORMATS = tuple(source_constant("scale/layout", "SHARD_SUFFIXES"))
_SHARD_SIZE = source_constant("scale/layout", "DEFAULT_SHARD_SIZE")


def _encode_worker_body(device: str, args: dict[str, Any]) -> None:
    from ..calibrators import FlowCalibrator
    from ..scale.encode import encode_file_to_store
    from ..scale.launch import current_topology

    topology = current_topology()
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
    calibrator = None
    if args["model_dir"]:
        embedder = load_embedder(args["model_dir"], device, args["dtype"])
        encoder, calibrator = embedder.encoder, embedder.calibrator
        if isinstance(calibrator, FlowCalibrator) and calibrator.is_fitted:
            calibrator.flow_.to(device)  # loading puts it on the default GPU; keep it beside this rank's encoder
    else:
        encoder = build_encoder(args["model"], args["pooling"], args["max_length"], device, args["dtype"])
    options = ("shard_size", "chunk_size", "batch_size", "encoding_errors", "overwrite", "merge", "text_column")
    options += ("input_format", "shard_format", "id_column")
    summary = encode_file_to_store(
        args["input"],
        args["output"],
        encoder,
        calibrator=calibrator,
        show_progress=not args["quiet"],
        **{name: args[name] for name in options},
    )
    if topology.is_main:
        print(json.dumps(summary), flush=True)


InputFileArg = Annotated[
    Path,
    typer.Argument(
        help="UTF-8 text file, one sentence per line; or a Parquet / Arrow IPC (Feather v2) file with a text "
        "column (.parquet, .arrow, .feather).",
        exists=True,
        dir_okay=False,
    ),
]
StoreOutOpt = Annotated[Path, typer.Option("--output", "-o", help="Store folder (created; resumed if it exists).")]
ShardSizeOpt = Annotated[int, typer.Option(help="Rows per shard file (a multiple of --chunk-size).")]
ChunkSizeOpt = Annotated[int, typer.Option(help="Sentences length-sorted together by the encoder.")]
MergeOpt = Annotated[bool, typer.Option(metavar="", help="Also write OUTPUT/embeddings.npy, all rows in one array.")]
RestartOpt = Annotated[bool, typer.Option(metavar="", help="Delete a store already in OUTPUT instead of resuming it.")]
InputFormatOpt = Annotated[
    Literal[_INPUT_FORMATS] | None,
    typer.Option(help=f"{' | '.join(_INPUT_FORMATS)}; default: from the input's suffix."),
]
ShardFormatOpt = Annotated[
    Literal[_SHARD_FORMATS],
    typer.Option("--format", help="Shard files: npy (memory-mapped) | parquet | arrow (row, id, embedding)."),
]
IdColumnOpt = Annotated[
    str | None,
    typer.Option(help="A Parquet/Arrow input column copied beside each embedding (needs --format parquet|arrow)."),
]


@app.command("distributed-encode", epilog=_EPILOG_ENCODE)
def distributed_encode(
    input: InputFileArg,
    output: StoreOutOpt,
    model_dir: ModelDirOpt = None,
    model: ModelOpt = None,
    pooling: PoolingOpt = "mean",
    max_length: MaxLenOpt = 64,
    shard_size: ShardSizeOpt = _SHARD_SIZE,
    chunk_size: ChunkSizeOpt = 16384,
    batch_size: BatchOpt = None,
    dtype: DtypeOpt = "auto",
    device: RankDeviceOpt = None,
    devices: DevicesOpt = None,
    encoding_errors: ErrorsOpt = "strict",
    merge: MergeOpt = False,
    overwrite: RestartOpt = False,
    text_column: TextColumnOpt = None,
    input_format: InputFormatOpt = None,
    shard_format: ShardFormatOpt = "npy",
    id_column: IdColumnOpt = None,
    backend: BackendOpt = "gloo",
    timeout_minutes: TimeoutOpt = 60.0,
    quiet: QuietOpt = False,
) -> None:
    """Encode a text file (or a Parquet/Arrow text column) into sharded embeddings on every rank of a torchrun/srun
    job (resumable)."""
    args = {**locals(), "input": str(input), "output": str(output)}
    from ..encoding.pooling import parse_without_model
    from ..errors import InputError
    from ..io.arrow import TableColumn, open_input
    from ..io.files import check_output_folder
    from ..scale.layout import check_store_options

    if model_dir and model:
        raise InputError("give --model-dir (a fitted model) or --model (a raw encoder), not both")
    if not model_dir and parse_without_model(pooling).weighting.weighted:
        # A weighted pooling's token counts are fitted with the model (bertflow fit); a raw encoder has none.
        raise InputError(f"pooling {pooling!r} needs token statistics: fit a model with it and pass --model-dir")
    # An existing store is resumed (or restarted with --overwrite); anything else non-empty is refused.
    check_output_folder(output, "store", overwrite=overwrite, resume=True, inputs=[input, *filter(None, [model_dir])])
    # The store options, the input and a table's columns (its metadata only), before any rank starts.
    check_store_options(
        shard_size=shard_size,
        chunk_size=chunk_size,
        batch_size=batch_size,
        encoding_errors=encoding_errors,
        shard_format=shard_format,
        id_column=id_column,
    )
    source = open_input(input, text_column=text_column, input_format_name=input_format, id_column=id_column)
    if isinstance(source, TableColumn):
        _ = source.rows  # opens the file: a missing column or a column that is not text fails here
    run_on_ranks(_encode_worker_body, devices, backend, timeout_minutes, args)
