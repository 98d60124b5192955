"""How the distributed commands (``distributed-encode``, ``distributed-fit``) run their body once per rank: under
``torchrun`` (or a bare ``srun``) the ranks come from the environment; with ``--devices cuda:0,cuda:1`` and no
launcher, this process spawns one rank per device itself. A rank's bertflow error is one line, exit status 2."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import typer

from .options import quiet_libraries


def rank_device(device: str | None) -> str:
    """``--device`` for this rank: ``cuda`` alone means this rank's GPU (``cuda:LOCAL_RANK``)."""
    from ..scale.launch import current_topology, default_device

    if device is None:
        return default_device()
    if device == "cuda":
        return f"cuda:{current_topology().local_rank}"
    return device


def run_on_ranks(body: Any, devices: str | None, backend: str, timeout_minutes: float, args: dict[str, Any]) -> None:
    """Run ``body(device, args)`` (module level, so spawned ranks can import it) on every rank, through
    :func:`guarded`: spawned per ``--devices``, or as this launcher's rank."""
    from ..errors import InputError
    from ..scale.launch import Topology, launch_local, process_group

    if devices:
        if Topology.from_env().world_size > 1:
            raise InputError("--devices spawns its own ranks; do not combine it with torchrun or srun")
        names = [d.strip() for d in devices.split(",") if d.strip()]
        import torch.multiprocessing as mp

        try:
            launch_local(
                functools.partial(guarded, body), names, args, backend=backend, timeout_minutes=timeout_minutes
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
        guarded(body, None, args)


def guarded(body: Any, device: str | None, args: dict[str, Any]) -> None:
    """Run one rank's body on its device (``--devices``' entry, else :func:`rank_device`); print its bertflow error
    as one line (once, for errors broadcast from rank 0), exit 2."""
    from ..errors import BertflowError, describe_os_error
    from ..scale.launch import current_topology

    try:
        quiet_libraries()
        body(device or rank_device(args["device"]), args)
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
