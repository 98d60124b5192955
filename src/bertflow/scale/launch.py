"""Processes for scale-out: topology from the environment (torchrun, Slurm), the gloo process group, collective
helpers, and the local multi-process launcher (``--devices``) with its CPU-thread sharing.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import errors
from ..errors import BertflowError, InputError, describe_os_error
from ..resources import share_cpu_threads


@dataclass(frozen=True)
class Topology:
    """Where this process sits: its global ``rank`` among ``world_size``, and its ``local_rank`` among the
    ``local_world_size`` processes of its node (which picks the GPU, ``cuda:{local_rank}``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the one that plans, finalises and prints)."""
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Topology:
        """The topology ``torchrun`` (``RANK``...) or a bare ``srun`` (``SLURM_PROCID``...) set; rank 0 of 1
        without either (a one-task SLURM job that starts torchrun is read through torchrun's variables)."""
        env = os.environ if environ is None else environ
        if "RANK" in env and "WORLD_SIZE" in env:
            values = env["RANK"], env["WORLD_SIZE"], env.get("LOCAL_RANK", 0), env.get("LOCAL_WORLD_SIZE", 1)
        elif "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
            per_node = env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1"))
            per_node = per_node.split("(")[0].split(",")[0]  # "4(x2)" or "4,2": the first node's count
            values = env["SLURM_PROCID"], env["SLURM_NTASKS"], env.get("SLURM_LOCALID", 0), per_node
        else:
            return cls()
        return cls(*map(int, values))


def current_topology() -> Topology:
    """The topology of the initialised process group, or :meth:`Topology.from_env` when there is none."""
    env = Topology.from_env()
    if dist.is_available() and dist.is_initialized():
        return Topology(dist.get_rank(), dist.get_world_size(), env.local_rank, env.local_world_size)
    return env


def default_device() -> str:
    """``cuda:{local_rank}`` when CUDA is available, else ``cpu``."""
    if torch.cuda.is_available():
        return f"cuda:{current_topology().local_rank % torch.cuda.device_count()}"
    return "cpu"


@contextlib.contextmanager
def process_group(
    backend: str = "gloo", *, init_method: str | None = None, timeout_minutes: float = 60.0
) -> Iterator[Topology]:
    """Join the job's process group (``backend`` gloo or nccl, rendezvous ``init_method``, default ``env://``)
    for the block and yield this process's topology. A single process joins nothing; a group the caller initialised
    is used and left open. ``timeout_minutes``: how long a collective waits for the slowest rank (keep it above one
    rank's share of an encoding, which the final barrier waits for)."""
    topology = Topology.from_env()
    if topology.world_size == 1 or dist.is_initialized():
        yield current_topology()
        return
    if init_method is None or init_method == "env://":
        if "MASTER_ADDR" not in os.environ:
            raise InputError(
                "a multi-process launch needs MASTER_ADDR and MASTER_PORT (torchrun sets them; under a bare srun, "
                "export them in the sbatch script, see docs/distributed.md)"
            )
        # A bare srun sets only SLURM_* variables; env:// reads RANK and WORLD_SIZE.
        os.environ.setdefault("RANK", str(topology.rank))
        os.environ.setdefault("WORLD_SIZE", str(topology.world_size))
        os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(
        backend,
        init_method=init_method or "env://",
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=datetime.timedelta(minutes=timeout_minutes),
    )
    try:
        yield current_topology()
        # Leave together: a rank that tears gloo down while a peer still works on (rank 0 finalising and merging
        # the store) can abort at exit ("terminate called without an active exception", SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if rank_and_world()[1] > 1:
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if rank_and_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def run_on_main(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 and hand its result, or its bertflow error, to every rank (which would otherwise wait
    at the next collective until the timeout)."""
    rank, _ = rank_and_world()
    payload: tuple[str, Any] = ("ok", None)
    if rank == 0:
        try:
            payload = ("ok", fn())
        except BertflowError as e:
            payload = ("error", (type(e).__name__, str(e)))
        except OSError as e:  # disk full, read-only folder...: every rank stops with the same one-line error
            payload = ("error", ("OutputError", describe_os_error(e)))
    payload = broadcast_object(payload)
    if payload[0] == "error":
        name, message = payload[1]
        cls = getattr(errors, name, BertflowError)
        error = cls(message) if isinstance(cls, type) and issubclass(cls, BertflowError) else BertflowError(message)
        error.from_rank0 = rank != 0  # type: ignore[attr-defined]  # the CLI prints it once, on rank 0
        raise error
    return payload[1]


def launch_local(
    fn: Callable[..., Any],
    devices: Sequence[str],
    *args: Any,
    backend: str = "gloo",
    timeout_minutes: float = 60.0,
) -> None:
    """Run ``fn(device, *args)`` (a module-level function: processes are spawned) in one process per device, as
    the ranks of one group rendezvousing over a temporary file: ``torchrun --nproc_per_node=len(devices)`` on one
    machine. CPU ranks split the cores. A failed rank raises torch.multiprocessing's ProcessRaised/ExitedException."""
    import torch.multiprocessing as mp

    if not devices:
        raise InputError("launch_local needs at least one device")
    with tempfile.TemporaryDirectory(prefix="bertflow-pg-", ignore_cleanup_errors=True) as folder:
        rendezvous = os.path.join(folder, "rendezvous")
        mp.spawn(
            _local_entry, args=(fn, list(devices), rendezvous, backend, timeout_minutes, args), nprocs=len(devices)
        )


def _local_entry(
    index: int,
    fn: Callable[..., Any],
    devices: list[str],
    rendezvous: str,
    backend: str,
    timeout_minutes: float,
    args: tuple[Any, ...],
) -> None:
    world = len(devices)
    os.environ.update(RANK=str(index), WORLD_SIZE=str(world), LOCAL_RANK=str(index), LOCAL_WORLD_SIZE=str(world))
    share_cpu_threads(devices, index)
    with process_group(backend, init_method=f"file://{rendezvous}", timeout_minutes=timeout_minutes):
        fn(devices[index], *args)
