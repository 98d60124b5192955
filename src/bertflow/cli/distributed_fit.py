"""``bertflow distributed-fit``: fit a flow or whitening on a store across every rank, the same result as one
process; rank 0 saves the model (:mod:`.ranks` runs the ranks)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ..calibrators.registry import catalogue
from ._app import app
from .options import (
    BackendOpt,
    DevicesOpt,
    EpochsOpt,
    OverwriteOpt,
    QuietOpt,
    RankDeviceOpt,
    SeedOpt,
    TimeoutOpt,
    ValidationFractionOpt,
    fit_summary,
)
from .ranks import run_on_ranks

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
    run_on_ranks(_fit_worker_body, devices, backend, timeout_minutes, args)
