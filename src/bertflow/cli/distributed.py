"""``bertflow distributed-encode`` and ``bertflow distributed-fit``: run under torchrun, srun, or with --devices.

Each command body runs once per rank. Under ``torchrun`` (or a bare ``srun``) the ranks come from the environment;
with ``--devices cuda:0,cuda:1`` and no launcher, this process spawns one rank per device itself.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..calibrators.registry import catalogue
from ._app import app
from .options import (
    BatchOpt,
    DtypeOpt,
    EpochsOpt,
    ErrorsOpt,
    MaxLenOpt,
    ModelDirOpt,
    ModelOpt,
    OverwriteOpt,
    PoolingOpt,
    QuietOpt,
    SeedOpt,
    TextColumnOpt,
    ValidationFractionOpt,
    build_encoder,
    check_device,
    fit_summary,
    load_embedder,
    quiet_libraries,
    source_constant,
)

_EPILOG_ENCODE = """Examples:

  bertflow distributed-encode corpus.txt -o emb --model bert-base-uncased --pooling first-last-avg

  torchrun --nproc_per_node=8 -m bertflow distributed-encode corpus.txt -o emb --model-dir my-flow

  bertflow distributed-encode corpus.txt -o emb --devices cuda:0,cuda:1      (no torchrun, one machine)

  bertflow distributed-encode docs.parquet --text-column body --id-column doc_id --format parquet -o emb

Re-running the same command resumes: finished shards are kept. Read the result with
bertflow.scale.reader.open_embeddings("emb"), or pass --merge for one emb/embeddings.npy. See docs/distributed.md.
"""

_EPILOG_FIT = """Examples:

  torchrun --nproc_per_node=8 -m bertflow distributed-fit emb -o my-flow --calibrator flow

  bertflow distributed-fit emb -o my-white --calibrator whitening-256
"""

#: Registry names of the calibrators that ``distributed-fit`` fits across ranks (:mod:`bertflow.scale.fit` has a
#: distributed fit for these two only); their specs, read from the registry, are the help and the refusal.
DISTRIBUTED_CALIBRATORS = ("flow", "whitening")


def distributed_specs() -> list[str]:
    """The calibrator specs ``distributed-fit`` accepts (``flow``, ``whitening-K`` ...), from the registry."""
    return [spec for entry in catalogue() if entry.name in DISTRIBUTED_CALIBRATORS for spec in entry.specs]


def _check_devices(devices: str | None) -> str | None:
    """``--devices``' callback: refuse an unknown or absent device before any rank starts."""
    for name in (devices or "").split(","):
        check_device(name.strip() or None)
    return devices


DevicesOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated local devices, one rank each, spawned here without torchrun (cuda:0,cuda:1).",
        callback=_check_devices,
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


#: How distributed-encode reads its input (default: from the suffix), and the file format of a store's shards.
_INPUT_FORMATS = ("text", *source_constant("io/arrow", "TABLE_FORMATS"))
_SHARD_FORMATS = tuple(source_constant("scale/layout", "SHARD_SUFFIXES"))


def _rank_device(device: str | None) -> str:
    """``--device`` for this rank: ``cuda`` alone means this rank's GPU (``cuda:LOCAL_RANK``)."""
    from ..scale.launch import current_topology, default_device

    if device is None:
        return default_device()
    if device == "cuda":
        return f"cuda:{current_topology().local_rank}"
    return device


def _run(body: Any, devices: str | None, backend: str, timeout_minutes: float, args: dict[str, Any]) -> None:
    """Run ``body(device, args)`` (module level, so spawned ranks can import it) on every rank, through
    :func:`_guarded`: spawned per ``--devices``, or as this launcher's rank."""
    from ..errors import InputError
    from ..scale.launch import Topology, launch_local, process_group

    if devices:
        if Topology.from_env().world_size > 1:
            raise InputError("--devices spawns its own ranks; do not combine it with torchrun or srun")
        names = [d.strip() for d in devices.split(",") if d.strip()]
        import torch.multiprocessing as mp

        try:
            launch_local(
                functools.partial(_guarded, body), names, args, backend=backend, timeout_minutes=timeout_minutes
            )
        except mp.ProcessRaisedException as e:
            # An unexpected error: the message carries the rank's traceback, which nobody has printed yet.
            typer.echo(f"bertflow: error: a rank failed:\n{e}", err=True)
            raise typer.Exit(1) from None
        except mp.ProcessExitedException as e:
            # The rank that stopped has printed why (a bertflow error) or was killed; say which, exit like any error.
            typer.echo(f"bertflow: error: a rank failed ({str(e).splitlines()[0]})", err=True)
            raise typer.Exit(2) from None
        return
    with process_group(backend, timeout_minutes=timeout_minutes):
        _guarded(body, None, args)


def _guarded(body: Any, device: str | None, args: dict[str, Any]) -> None:
    """Run one rank's body on its device (``--devices``' entry, else :func:`_rank_device`); print its bertflow error
    as one line (once, for errors broadcast from rank 0), exit 2."""
    from ..errors import BertflowError, describe_os_error
    from ..scale.launch import current_topology

    try:
        quiet_libraries()
        body(device or _rank_device(args["device"]), args)
    except (BertflowError, OSError) as e:
        topology = current_topology()
        if not getattr(e, "from_rank0", False):
            where = f" (rank {topology.rank})" if topology.world_size > 1 else ""
            text = e if isinstance(e, BertflowError) else describe_os_error(e)
            print(f"bertflow: error{where}: {text}", file=sys.stderr, flush=True)
        if topology.world_size > 1:
            # Leave at once: the other ranks may be inside a collective that a polite shutdown would wait for;
            # the launcher (torchrun, srun, launch_local) stops them when it sees this exit.
            os._exit(2)
        raise SystemExit(2) from None


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
    shard_size: ShardSizeOpt = source_constant("scale/layout", "DEFAULT_SHARD_SIZE"),
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
    _run(_encode_worker_body, devices, backend, timeout_minutes, args)


def _fit_worker_body(device: str, args: dict[str, Any]) -> None:
    from ..calibrators import FlowCalibrator, WhiteningCalibrator, parse_calibrator
    from ..embedder import Embedder
    from ..encoding.encoder import SentenceEncoder
    from ..errors import CompatibilityError, InputError
    from ..model_folder import fit_record
    from ..scale.fit import fit_flow_distributed, fit_whitening_distributed
    from ..scale.launch import current_topology
    from ..scale.reader import open_embeddings

    topology = current_topology()
    # Every shard's sha256 is checked before fitting (one read of the store, which the fit reads at least once
    # anyway): one flipped float in one shard would otherwise give a plausible-looking, useless model.
    store = open_embeddings(args["store"], verify=True)
    manifest = store.manifest
    if manifest.get("calibrator"):
        raise InputError(f"{args['store']} holds calibrated embeddings; fit on raw ones (encode without --model-dir)")
    if not manifest.get("encoder"):
        raise InputError(f"{args['store']} does not record its encoder, so the fitted model could not be used")
    cal = parse_calibrator(
        args["calibrator"],
        seed=args["seed"],
        epochs=args["epochs"],
        validation_fraction=args["validation_fraction"],
        verbose=not args["quiet"],
    )
    started = time.perf_counter()
    if isinstance(cal, FlowCalibrator):
        fit_flow_distributed(store, cal, device=device)
    elif isinstance(cal, WhiteningCalibrator):
        fit_whitening_distributed(store, cal, device=device if device.startswith("cuda") else None)
    else:
        raise InputError(
            f"distributed-fit supports {', '.join(distributed_specs())}, not {args['calibrator']!r}; "
            "fit other calibrators with `bertflow fit`"
        )
    seconds = time.perf_counter() - started
    if not topology.is_main:
        return
    encoder = SentenceEncoder.from_config(manifest["encoder"], device="cpu")
    if encoder.get_config()["fingerprint"] != manifest["encoder"]["fingerprint"]:
        raise CompatibilityError(
            f"{manifest['encoder']['model']} now has other weights than when {args['store']} was encoded; the fitted "
            "calibrator would not match it"
        )
    embedder = Embedder(encoder, cal)
    # The sentences were never all in one process, so the record names the input file's sha256 instead of theirs.
    fit_info = fit_record(
        int(store.shape[0]),
        corpus_file_sha256=(manifest.get("input") or {}).get("sha256"),
        regime=f"distributed corpus {Path(manifest.get('input_path', args['store'])).name}",
        seconds=seconds,
        device=device,
        ranks=topology.world_size,
    )
    embedder.record_fit(fit_info).save(args["output"], overwrite=args.get("overwrite", False))
    summary = fit_summary(args["output"], int(store.shape[0]), cal, round(seconds, 2), world_size=topology.world_size)
    print(summary, flush=True)


@app.command("distributed-fit", epilog=_EPILOG_FIT)
def distributed_fit(
    store: Annotated[
        Path,
        typer.Argument(help="A store written by distributed-encode (raw embeddings).", exists=True, file_okay=False),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the fitted model to (rank 0).")],
    calibrator: Annotated[str, typer.Option(help=f"{' | '.join(distributed_specs())}.")] = "flow",
    seed: SeedOpt = 0,
    epochs: EpochsOpt = 1.0,
    validation_fraction: ValidationFractionOpt = 0.0,
    device: RankDeviceOpt = None,
    devices: DevicesOpt = None,
    backend: BackendOpt = "gloo",
    timeout_minutes: TimeoutOpt = 60.0,
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Fit a flow or whitening on a store across every rank (same result as one process); rank 0 saves it."""
    args = {**locals(), "store": str(store), "output": str(output)}
    from ..io.files import check_output_folder
    from ..validation import check_epochs

    # Before any rank starts: a destination that may not be written fails now, not after the fit.
    check_output_folder(output, "model", overwrite=overwrite, inputs=[store])
    check_epochs(epochs)
    _run(_fit_worker_body, devices, backend, timeout_minutes, args)
