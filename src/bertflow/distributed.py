"""Scale past one machine with torch.distributed: sharded encoding to disk, and exact distributed fitting.

Launch with ``torchrun`` (one node or several, also under SLURM) or, on one machine, with
:func:`launch_local` / ``--devices`` (no torchrun). Every rank reads its topology from the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; or ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` under a bare
``srun``) and talks over the ``gloo`` backend: encoding needs only barriers and a few small messages, and flow
fitting all-reduces ~150k gradients a step, which gloo also does for CUDA tensors. See ``docs/distributed.md``.

Encoding (:func:`encode_file_to_store`, ``bertflow distributed-encode``): rank 0 indexes the input file once (line
count, sha256, the byte offset of every shard's first line) and writes the manifest; each rank then encodes its
contiguous block of the shards that are not finished yet, seeking straight to their byte offsets, and writes each
shard atomically (:class:`bertflow.store.ShardWriter`). Shard boundaries are multiples of the encoder's chunk size,
so every forward pass sees exactly the sentences it would in one process: the store is bit for bit what
``SentenceEncoder.iter_encode`` (or ``bertflow encode``) gives on the same kind of device.

Fitting: whitening from all-reduced float64 moments (:func:`fit_whitening_distributed`, exact up to rounding),
and the flow with every rank computing its share of each global batch and gradients summed
(:func:`fit_flow_distributed`, the single-process fit up to floating-point summation order).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from . import errors
from ._version import __version__
from .data import check_not_utf16
from .errors import BertflowError, CompatibilityError, InputError, describe_os_error
from .serialization import LOCK_NAME, folder_lock
from .store import (
    MANIFEST_NAME,
    MERGED_NAME,
    SHARD_DIR,
    ShardSpec,
    ShardWriter,
    finalize_manifest,
    merge_shards,
    new_manifest,
    plan_shards,
    read_manifest,
    remove_temporary_files,
    shard_record,
    write_manifest,
)
from .validation import is_blank

if TYPE_CHECKING:
    from .calibrators import Calibrator, FlowCalibrator, WhiteningCalibrator
    from .encoder import SentenceEncoder

__all__ = [
    "Topology",
    "current_topology",
    "process_group",
    "default_device",
    "launch_local",
    "usable_cpus",
    "LineIndex",
    "index_lines",
    "read_lines",
    "encode_file_to_store",
    "encode_multi_device",
    "Moments",
    "all_reduce_moments",
    "fit_whitening_distributed",
    "fit_flow_distributed",
    "GradientAllReduce",
]

logger = logging.getLogger(__name__)

#: Manifest fields that a resumed run must reproduce exactly (otherwise its shards would not fit together).
IDENTITY_KEYS = (
    "input",
    "encoder",
    "compute_dtype",
    "calibrator",
    "rows",
    "dim",
    "dtype",
    "shard_size",
    "chunk_size",
    "batch_size",
    "max_tokens",
    "encoding_errors",
)


# -- topology and process group ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """Where this process sits: its global rank among ``world_size`` and its local rank on its node.

    Attributes:
        rank: global rank, 0 .. world_size - 1.
        world_size: number of processes in the job.
        local_rank: rank on this node (picks the GPU: ``cuda:{local_rank}``).
        local_world_size: processes on this node.
    """

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
        """Read the topology that ``torchrun`` (``RANK``...) or a bare ``srun`` (``SLURM_PROCID``...) set.

        Without either, this is a single process (rank 0 of 1). A SLURM job of one task that starts torchrun
        itself is read through torchrun's variables, which its workers see.
        """
        env = os.environ if environ is None else environ
        if "RANK" in env and "WORLD_SIZE" in env:
            return cls(
                int(env["RANK"]),
                int(env["WORLD_SIZE"]),
                int(env.get("LOCAL_RANK", 0)),
                int(env.get("LOCAL_WORLD_SIZE", 1)),
            )
        if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
            per_node = env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1"))
            return cls(
                int(env["SLURM_PROCID"]),
                int(env["SLURM_NTASKS"]),
                int(env.get("SLURM_LOCALID", 0)),
                int(per_node.split("(")[0].split(",")[0]),
            )
        return cls()


def current_topology() -> Topology:
    """The topology of the initialised process group, or :meth:`Topology.from_env` when there is none."""
    env = Topology.from_env()
    if dist.is_available() and dist.is_initialized():
        return Topology(dist.get_rank(), dist.get_world_size(), env.local_rank, env.local_world_size)
    return env


def default_device(topology: Topology | None = None) -> str:
    """``cuda:{local_rank}`` when CUDA is available, else ``cpu``."""
    topology = topology or current_topology()
    if torch.cuda.is_available():
        return f"cuda:{topology.local_rank % torch.cuda.device_count()}"
    return "cpu"


@contextlib.contextmanager
def process_group(
    backend: str = "gloo", *, init_method: str | None = None, timeout_minutes: float = 60.0
) -> Iterator[Topology]:
    """Join the job's process group for the duration of the block and yield this process's topology.

    A single process (no torchrun variables) joins nothing, so the same code runs with and without a launcher;
    a group initialised by the caller is used as it is and left open.

    Args:
        backend: ``"gloo"`` (default; CPU, and CUDA tensors for all-reduce and broadcast) or ``"nccl"``.
        init_method: rendezvous URL; default ``env://`` (``MASTER_ADDR``/``MASTER_PORT``, set by torchrun).
        timeout_minutes: how long a collective waits for the slowest rank (the final barrier of an encoding
            waits for the rank with the most work, so keep it above one rank's share of the job).
    """
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


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if _world()[1] > 1:
        dist.barrier()


def _broadcast_object(obj: Any, src: int = 0) -> Any:
    if _world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def _all_gather_object(obj: Any) -> list[Any]:
    world = _world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _share(n: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous row range ``[lo, hi)`` of rank ``rank`` when ``n`` rows are split as evenly as possible."""
    return n * rank // world, n * (rank + 1) // world


def _run_on_main(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 and hand its result, or its bertflow error, to every rank.

    Without this, an error on rank 0 (a bad input file, say) would leave the other ranks waiting at the next
    collective until the timeout; with it, every rank raises the same error at once.
    """
    rank, _ = _world()
    payload: tuple[str, Any] = ("ok", None)
    if rank == 0:
        try:
            payload = ("ok", fn())
        except BertflowError as e:
            payload = ("error", (type(e).__name__, str(e)))
        except OSError as e:  # disk full, read-only folder...: every rank stops with the same one-line error
            payload = ("error", ("OutputError", describe_os_error(e)))
    payload = _broadcast_object(payload)
    if payload[0] == "error":
        name, message = payload[1]
        cls = getattr(errors, name, BertflowError)
        error = cls(message) if isinstance(cls, type) and issubclass(cls, BertflowError) else BertflowError(message)
        error.from_rank0 = rank != 0  # type: ignore[attr-defined]  # the CLI prints it once, on rank 0
        raise error
    return payload[1]


# -- local multi-process launch (no torchrun) ---------------------------------------------------------------------


def launch_local(
    fn: Callable[..., Any],
    devices: Sequence[str],
    *args: Any,
    backend: str = "gloo",
    timeout_minutes: float = 60.0,
) -> None:
    """Run ``fn(device, *args)`` in one spawned process per device, as the ranks of one process group.

    The single-machine stand-in for ``torchrun --nproc_per_node=len(devices)``: rank ``i`` gets ``devices[i]``
    and a group initialised over a temporary file (no port to pick). ``fn`` must be importable (a module-level
    function) because processes are spawned, not forked. CPU ranks split the machine's cores between them.

    Raises:
        torch.multiprocessing.ProcessRaisedException / ProcessExitedException: a rank failed; the others are
            stopped.
    """
    import torch.multiprocessing as mp

    if not devices:
        raise InputError("launch_local needs at least one device")
    folder = tempfile.mkdtemp(prefix="bertflow-pg-")
    try:
        mp.spawn(
            _local_entry,
            args=(fn, list(devices), os.path.join(folder, "rendezvous"), backend, timeout_minutes, args),
            nprocs=len(devices),
            join=True,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
    _share_cpu_threads(devices, index)
    dist.init_process_group(
        backend,
        init_method=f"file://{rendezvous}",
        rank=index,
        world_size=world,
        timeout=datetime.timedelta(minutes=timeout_minutes),
    )
    try:
        fn(devices[index], *args)
    finally:
        dist.destroy_process_group()


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask: what a container or ``taskset`` grants, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _share_cpu_threads(devices: Sequence[str], index: int, threads: int | None = None) -> None:
    # Several CPU ranks each running torch's default thread pool would oversubscribe the cores many times over.
    n_cpu = sum(1 for d in devices if str(d).startswith("cpu"))
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    elif str(devices[index]).startswith("cpu") and n_cpu > 1:
        torch.set_num_threads(max(1, usable_cpus() // n_cpu))


# -- the input file: line index and reads by offset ----------------------------------------------------------------


@dataclass(frozen=True)
class LineIndex:
    """What one pass over a text file learns: its size, sha256, line count and where each shard starts.

    Attributes:
        bytes: file size.
        sha256: hex digest of the whole file.
        lines: number of lines (a last line without a newline counts; an empty file has 0).
        offsets: byte offset of line ``k * every`` for every ``k`` with ``k * every < lines``.
        every: the spacing of ``offsets`` in lines.
    """

    bytes: int
    sha256: str
    lines: int
    offsets: tuple[int, ...]
    every: int


def index_lines(path: str | Path, every: int, *, block_size: int = 1 << 24) -> LineIndex:
    """Count the lines of a file and record the byte offset of every ``every``-th one, in one streamed pass.

    Lines are split on ``b"\\n"`` only, as :func:`bertflow.data.iter_lines` does, so row ``i`` of a store is line
    ``i + 1`` of the file. Memory stays at one block whatever the file size.

    Args:
        path: the text file.
        every: spacing of the recorded offsets, in lines (the shard size).
        block_size: bytes read at a time.

    Raises:
        InputError: the file cannot be read.
    """
    if every < 1:
        raise InputError(f"every must be positive, got {every}")
    p = Path(path)
    h = hashlib.sha256()
    offsets = [0]
    newlines = 0  # newlines seen before the current block
    position = 0  # bytes before the current block
    last = b""
    try:
        with open(p, "rb") as fh:
            while block := fh.read(block_size):
                h.update(block)
                count = block.count(b"\n")
                # Shard k starts right after the (k * every)-th newline.
                target = len(offsets) * every
                if newlines + count >= target:
                    where = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                    while newlines + count >= target:
                        offsets.append(position + int(where[target - newlines - 1]) + 1)
                        target += every
                newlines += count
                position += len(block)
                last = block[-1:]
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from None
    lines = newlines + (1 if position and last != b"\n" else 0)
    n_shards = -(-lines // every)
    return LineIndex(position, h.hexdigest(), lines, tuple(offsets[:n_shards]), every)


def read_lines(path: str | Path, offset: int, count: int, *, first_line: int = 1, errors: str = "strict") -> list[str]:
    """Read ``count`` lines starting at byte ``offset``, decoded and checked like the whole-file readers.

    Only the terminator (``"\\n"`` or ``"\\r\\n"``) is removed; a UTF-8 BOM is dropped at offset 0.

    Args:
        path: the text file.
        offset: byte offset of the first line (from :func:`index_lines`).
        count: number of lines to read.
        first_line: 1-based number of the first line, for error messages.
        errors: ``"strict"`` (undecodable bytes raise) or ``"replace"`` (they become U+FFFD).

    Raises:
        InputError: the file ended early (it changed since it was indexed), a line is not UTF-8 (strict), or a
            line is empty or whitespace only (every line must be a sentence: row ``i`` is line ``i + 1``).
    """
    p = Path(path)
    out: list[str] = []
    with open(p, "rb") as fh:
        fh.seek(offset)
        for i, raw in enumerate(itertools.islice(fh, count)):
            number = first_line + i
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            check_not_utf16(raw, p, number)
            try:
                text = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{p}: line {number} is not valid UTF-8 (byte 0x{raw[e.start : e.start + 1].hex()} at byte "
                    f"column {e.start + 1}); re-encode the file or pass --encoding-errors replace"
                ) from None
            if i == 0 and offset == 0 and text.startswith("\ufeff"):
                text = text[1:]
            if is_blank(text):
                raise InputError(
                    f"{p}: line {number} is empty or only whitespace or invisible characters; every line becomes one "
                    "row, so remove blank lines first (e.g. grep -v '^[[:space:]]*$')"
                )
            out.append(text)
    if len(out) != count:
        raise InputError(
            f"{p} ended after line {first_line + len(out) - 1}, but {count} lines were expected from line "
            f"{first_line}: the file changed since it was indexed"
        )
    return out


# -- distributed encoding ------------------------------------------------------------------------------------------


def _encode_kwargs(batch_size: int | None, chunk_size: int) -> dict[str, int]:
    # batch_size only when given: then the encoder's own default batching applies (a token budget).
    return {"chunk_size": int(chunk_size)} | ({"batch_size": int(batch_size)} if batch_size is not None else {})


def _calibrator_identity(calibrator: Calibrator) -> dict[str, Any]:
    """Type, parameters and a sha256 of the fitted state of a calibrator (runtime settings left out)."""
    config = calibrator.to_config()
    config["params"] = {k: v for k, v in config["params"].items() if k not in ("device", "verbose")}
    _, arrays = calibrator._get_state()
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode("utf-8"))
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(arr.tobytes())
    return {"type": calibrator.name, "params": config["params"], "sha256": h.hexdigest()}


def _normalised(data: dict[str, Any]) -> dict[str, Any]:
    # JSON round trip: tuples become lists, as they will be when read back from the manifest.
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _prepare_store(
    input_path: Path, folder: Path, identity: dict[str, Any], shard_size: int, overwrite: bool
) -> tuple[dict[str, Any], list[int]]:
    """Rank 0: index the input, create or check the manifest, clear stale temporaries; return (manifest, done)."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder} exists and is not a folder")
    has_manifest = (folder / MANIFEST_NAME).is_file()
    if folder.is_dir() and not has_manifest:
        # Not a store: --overwrite does not change that (it replaces a store, never somebody else's files).
        strangers = [p.name for p in folder.iterdir() if p.name not in (SHARD_DIR, LOCK_NAME)]
        if strangers:
            raise InputError(
                f"{folder} is not empty and holds no embedding store ({', '.join(sorted(strangers)[:5])}...); "
                "write to a new or empty folder"
            )
    if overwrite and folder.is_dir():
        for name in (MANIFEST_NAME, MERGED_NAME):
            (folder / name).unlink(missing_ok=True)
        shutil.rmtree(folder / SHARD_DIR, ignore_errors=True)
        has_manifest = False
    index = index_lines(input_path, shard_size)
    if index.lines == 0:
        raise InputError(f"{input_path} has no lines to encode")
    specs = plan_shards(index.lines, shard_size, index.offsets)
    fresh = new_manifest(
        rows=index.lines,
        dim=identity["dim"],
        specs=specs,
        shard_size=shard_size,
        input={"bytes": index.bytes, "sha256": index.sha256, "lines": index.lines},
        input_path=str(input_path.resolve()),
        **{k: v for k, v in identity.items() if k not in ("dim",)},
    )
    fresh = _normalised(fresh)
    if has_manifest:
        manifest = read_manifest(folder)
        differ = [k for k in IDENTITY_KEYS if manifest.get(k) != fresh.get(k)]
        if manifest.get("shards") and [ShardSpec.from_json(e) for e in manifest["shards"]] != specs:
            differ.append("shards")
        if differ:
            raise InputError(
                f"{folder} holds embeddings made from another input or with other settings ({', '.join(differ)} "
                "differ); write to a new folder, or pass --overwrite to start this one afresh"
            )
        manifest["complete"] = False
        if any(shard_record(folder, s, manifest["dim"], manifest["dtype"]) is None for s in specs):
            # Shards will be rewritten: a merged copy made before would no longer be the store's concatenation.
            (folder / MERGED_NAME).unlink(missing_ok=True)
            manifest.pop("merged", None)
        write_manifest(folder, manifest)
    else:
        manifest = fresh
        write_manifest(folder, manifest)
    removed = remove_temporary_files(folder)
    if removed:
        logger.info("%s: removed %d temporary file(s) left by an interrupted run", folder, removed)
    done = [s.index for s in specs if shard_record(folder, s, manifest["dim"], manifest["dtype"]) is not None]
    return manifest, done


def encode_file_to_store(
    input_path: str | Path,
    folder: str | Path,
    encoder: SentenceEncoder,
    *,
    calibrator: Calibrator | None = None,
    shard_size: int = 131072,
    chunk_size: int = 16384,
    batch_size: int | None = None,
    encoding_errors: str = "strict",
    overwrite: bool = False,
    merge: bool = False,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Encode every line of a text file into an embedding store, this process being one rank of the job.

    Call it on every rank (inside :func:`process_group`, or alone for one process). Rank 0 indexes the file and
    writes the manifest; the shards not yet complete are split into contiguous blocks, one per rank; each rank
    reads its shards' lines by byte offset and writes each shard atomically; after a barrier rank 0 checks every
    shard, completes the manifest and optionally merges. Re-running the same call resumes: complete shards are
    skipped, so a killed rank costs at most the shard it was encoding.

    Args:
        input_path: UTF-8 text, one sentence per line (blank lines are an error: row ``i`` is line ``i + 1``).
        folder: the store folder (see :mod:`bertflow.store`).
        encoder: this rank's encoder, on this rank's device.
        calibrator: a fitted calibrator applied to every chunk (the store then holds calibrated vectors).
        shard_size: rows per shard file; a multiple of ``chunk_size``.
        chunk_size: sentences the encoder length-sorts together (as in ``iter_encode``); with the same
            ``chunk_size`` and ``batch_size`` every forward pass holds the same sentences as in one process, so the
            output is bit-identical to ``encoder.iter_encode`` on the same kind of device.
        batch_size: cap on sentences per forward pass; ``None`` leaves batching to the encoder (its token budget).
        encoding_errors: ``"strict"`` or ``"replace"`` for bytes that are not UTF-8.
        overwrite: delete an existing store in ``folder`` first, instead of resuming it.
        merge: also write ``embeddings.npy`` (rank 0, after the barrier).
        show_progress: progress bar on rank 0 (counting rank 0's rows).

    Returns:
        A JSON-ready summary: on rank 0 of the whole run (rows, shards encoded and skipped, seconds, rows per
        second, per-rank figures), on other ranks of this rank's work.

    Raises:
        InputError: bad input file or options, or a store in ``folder`` made with other settings.
    """
    from tqdm.auto import tqdm

    from .calibrators import IdentityCalibrator
    from .validation import check_finite

    if shard_size < 1 or chunk_size < 1 or (batch_size is not None and batch_size < 1):
        raise InputError("shard_size, chunk_size and batch_size must be positive")
    if shard_size % chunk_size:
        raise InputError(
            f"shard_size ({shard_size}) must be a multiple of chunk_size ({chunk_size}), so that every shard is made "
            "of whole encoder chunks and the output does not depend on how the input was split"
        )
    if encoding_errors not in ("strict", "replace"):
        raise InputError(f"encoding_errors must be 'strict' or 'replace', got {encoding_errors!r}")
    if isinstance(calibrator, IdentityCalibrator):
        calibrator = None
    input_path, folder = Path(input_path), Path(folder)
    rank, world = _world()
    started = time.time()
    dim = int(calibrator.n_features_out_) if calibrator is not None else int(encoder.dim)
    identity = {
        "encoder": encoder.get_config(),
        "compute_dtype": str(getattr(encoder, "dtype", "unknown")).replace("torch.", ""),
        "calibrator": _calibrator_identity(calibrator) if calibrator is not None else None,
        "dim": dim,
        "dtype": "float32",
        "chunk_size": int(chunk_size),
        "batch_size": batch_size,
        # The encoder's padded-token budget per forward pass shapes the batches too (None: its device default).
        "max_tokens": getattr(encoder, "max_tokens", None),
        "encoding_errors": encoding_errors,
    }
    encode_kwargs = _encode_kwargs(batch_size, chunk_size)
    if not input_path.is_file():
        raise InputError(f"cannot read {input_path}: no such file")
    # Rank 0 holds FOLDER/.lock for the whole run: a second run on the same store stops with a clear error instead
    # of deleting this run's temporary files and racing it for the shards.
    lock = contextlib.ExitStack()

    def prepare() -> tuple[dict[str, Any], list[int]]:
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{folder} exists and is not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        lock.enter_context(folder_lock(folder, "distributed-encode run"))
        return _prepare_store(input_path, folder, identity, shard_size, overwrite)

    with lock:
        manifest, done = _run_on_main(prepare)
        ours = _normalised(identity)
        if any(ours[k] != manifest.get(k) for k in ours if k != "dim") or manifest["dim"] != dim:
            # Every rank must encode with what rank 0 recorded: same weights, pooling, precision, calibrator.
            raise CompatibilityError(
                f"rank {rank}: this rank's encoder or calibrator differs from rank 0's (model files differ between "
                "nodes, or another dtype was picked); every rank must use the same model and options"
            )
        specs = [ShardSpec.from_json(e) for e in manifest["shards"]]
        done_set = set(done)
        todo = [s for s in specs if s.index not in done_set]
        lo, hi = _share(len(todo), rank, world)
        mine = todo[lo:hi]
        record = {"rank": rank, "world_size": world, "device": str(getattr(encoder, "device", "unknown"))}
        _barrier()  # every rank has its encoder loaded and its plan: the timed phase starts together
        t0 = time.perf_counter()
        rows_done, shard_times = 0, []
        total = sum(s.rows for s in mine)
        with tqdm(
            total=total, desc=f"encode (rank 0 of {world})", unit="sent", disable=not (show_progress and rank == 0)
        ) as bar:
            for spec in mine:
                t_shard = time.perf_counter()
                lines = read_lines(
                    input_path, spec.offset, spec.rows, first_line=spec.start + 1, errors=encoding_errors
                )
                with ShardWriter(folder, spec, dim, record=record) as writer:
                    row = spec.start
                    for part in encoder.iter_encode(lines, **encode_kwargs, progress=bar.update):
                        check_finite(part, what=f"embeddings of lines {row + 1}..{row + len(part)} of {input_path}")
                        if calibrator is not None:
                            part = calibrator.transform(part)
                        writer.write(part)
                        row += len(part)
                    writer.commit()
                rows_done += spec.rows
                shard_times.append((spec.rows, time.perf_counter() - t_shard))
        seconds = time.perf_counter() - t0
        mine_summary = {
            "rank": rank,
            "device": record["device"],
            "shards": len(mine),
            "rows": rows_done,
            "seconds": round(seconds, 4),
            "shard_rows": [r for r, _ in shard_times],
            "shard_seconds": [round(t, 4) for _, t in shard_times],
        }
        _barrier()  # all shards written
        wall = time.perf_counter() - t0
        per_rank = _all_gather_object(mine_summary)
        if rank != 0:
            return mine_summary
        run = {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "world_size": world,
            "encoded_shards": len(todo),
            "skipped_shards": len(done),
            "seconds": round(wall, 4),
            "host": socket.gethostname(),
            "bertflow_version": __version__,
        }
        final = finalize_manifest(folder, run=run)
        merged = str(merge_shards(folder)) if merge else None
        encoded_rows = sum(r["rows"] for r in per_rank)
        return {
            "output": str(folder),
            "rows": final["rows"],
            "dim": final["dim"],
            "shards": len(specs),
            "encoded_shards": len(todo),
            "skipped_shards": len(done),
            "encoded_rows": encoded_rows,
            "world_size": world,
            "seconds": round(wall, 4),
            "rows_per_second": round(encoded_rows / wall, 2) if wall > 0 and encoded_rows else None,
            "merged": merged,
            "per_rank": per_rank,
        }


# -- one machine, several devices, no torchrun -----------------------------------------------------------------


def encode_multi_device(
    sentences: Sequence[str],
    encoder: SentenceEncoder | dict[str, Any],
    devices: Sequence[str],
    *,
    dtype: str = "auto",
    batch_size: int | None = None,
    chunk_size: int = 16384,
    threads_per_process: int | None = None,
) -> np.ndarray:
    """Encode in memory with one spawned process per local device (e.g. ``["cuda:0", "cuda:1"]``), no torchrun.

    The sentences are cut into contiguous, chunk-aligned parts, one per device; each process loads the encoder
    on its device and writes its rows into a shared-memory result. The result equals
    ``np.concatenate(list(encoder.iter_encode(sentences, batch_size=..., chunk_size=...)))`` computed on one
    device of the same kind, bit for bit. Each process loads the model once, so this pays off from a few tens
    of thousands of sentences; for files and for several machines use :func:`encode_file_to_store`.

    Args:
        sentences: non-blank strings.
        encoder: a :class:`~bertflow.encoder.SentenceEncoder` or its ``get_config()``; its model must load by
            id or path (not a model object given directly).
        devices: one entry per process; ``"cpu"`` may repeat (the cores are then split between them).
        dtype: compute precision on every device (``"auto"``: bfloat16 on CUDA, float32 on CPU).
        batch_size, chunk_size: as in ``SentenceEncoder.iter_encode``.
        threads_per_process: torch CPU threads in each process; default: the usable cores split between the CPU
            processes (CPU results are bit-identical to one process only at the same thread count).

    Returns:
        float32 [N, D] in input order.
    """
    import torch.multiprocessing as mp

    from .validation import validate_sentences

    items = validate_sentences(sentences)
    config = encoder.get_config() if hasattr(encoder, "get_config") else dict(encoder)
    # A token budget set on the encoder object is not part of its config, but shapes the batches: carry it over.
    overrides = {"max_tokens": encoder.max_tokens} if getattr(encoder, "max_tokens", None) is not None else {}
    if not devices:
        raise InputError("encode_multi_device needs at least one device")
    if chunk_size < 1 or (batch_size is not None and batch_size < 1):
        raise InputError("batch_size and chunk_size must be positive")
    n, dim = len(items), int(config["dim"])
    if n == 0:
        return np.empty((0, dim), dtype=np.float32)
    # Whole chunks per device: each process then length-sorts exactly the chunks one process would.
    n_chunks = -(-n // chunk_size)
    bounds = [
        (min(n, a * chunk_size), min(n, b * chunk_size))
        for a, b in (_share(n_chunks, i, len(devices)) for i in range(len(devices)))
    ]
    out = torch.empty((n, dim), dtype=torch.float32).share_memory_()
    mp.spawn(
        _encode_part,
        args=(config, overrides, list(devices), dtype, batch_size, chunk_size, threads_per_process, bounds, items, out),
        nprocs=len(devices),
        join=True,
    )
    return out.numpy().copy()


def _encode_part(
    index: int,
    config: dict[str, Any],
    overrides: dict[str, Any],
    devices: list[str],
    dtype: str,
    batch_size: int | None,
    chunk_size: int,
    threads: int | None,
    bounds: list[tuple[int, int]],
    sentences: list[str],
    out: torch.Tensor,
) -> None:
    from .encoder import SentenceEncoder

    start, stop = bounds[index]
    if start == stop:
        return
    _share_cpu_threads(devices, index, threads)
    encoder = SentenceEncoder.from_config(config, device=devices[index], dtype=dtype, **overrides)
    if encoder.get_config().get("fingerprint") != config.get("fingerprint"):
        raise CompatibilityError(f"{config['model']} on {devices[index]} has other weights than the encoder given")
    row = start
    for part in encoder.iter_encode(sentences[start:stop], **_encode_kwargs(batch_size, chunk_size)):
        out[row : row + len(part)] = torch.from_numpy(part)
        row += len(part)


# -- distributed fitting -------------------------------------------------------------------------------------------


@dataclass
class Moments:
    """Sufficient statistics of rows ``x_i`` [D] shifted by a common reference point, summed over all ranks.

    Attributes:
        n: number of rows.
        shift: [D] the reference point ``s`` (the mean of the ranks' first chunks: near the mean, so the sums
            below lose no digits to cancellation).
        sum: [D] float64 sum of ``x_i - s``.
        sum_sq: [D] float64 sum of ``(x_i - s)**2``.
        sum_outer: [D, D] float64 sum of ``(x_i - s)(x_i - s)^T``, if asked for.
        abs_max: largest ``|x|`` over all rows.
    """

    n: int
    shift: np.ndarray
    sum: np.ndarray
    sum_sq: np.ndarray
    sum_outer: np.ndarray | None
    abs_max: float

    @property
    def mean(self) -> np.ndarray:
        """[D] mean of the rows."""
        return self.shift + self.sum / self.n

    def var(self, ddof: int = 0) -> np.ndarray:
        """[D] per-dimension variance (``ddof=0``: population)."""
        d = self.sum / self.n
        return np.maximum(self.sum_sq - self.n * d * d, 0.0) / (self.n - ddof)

    @property
    def std(self) -> np.ndarray:
        """[D] population std (ddof 0), as ``np.std``."""
        return np.sqrt(self.var(0))


def all_reduce_moments(
    chunks: Iterable[np.ndarray], dim: int, *, outer: bool = True, device: str | None = None
) -> Moments:
    """Sum float64 moments of this rank's rows and all-reduce them over the job (exact, order aside).

    Call on every rank, each with its own rows (a rank may have none). Two small collectives fix the shift;
    one all-reduce (of ``2 D + 1`` numbers, plus ``D^2`` with ``outer``) sums the statistics; one more takes the
    max of ``|x|``.

    Args:
        chunks: this rank's rows, as [n_i, D] blocks (memory stays at one block).
        dim: D (needed by ranks without rows).
        outer: also sum outer products (whitening needs them; the flow only the diagonal).
        device: where to accumulate (a CUDA device makes the D x D products of large corpora cheap); default CPU.

    Raises:
        InputError: no rows on any rank, wrong width, or NaN / Inf in the rows.
    """
    dev = torch.device(device or "cpu")
    iterator = iter(chunks)
    first = next(iterator, None)
    seed = torch.zeros(dim + 1, dtype=torch.float64, device=dev)
    if first is not None:
        first = np.asarray(first)
        _check_block(first, dim)
        seed[0] = len(first)
        seed[1:] = torch.from_numpy(first.astype(np.float64).sum(axis=0)).to(dev)
    _all_reduce(seed)
    if seed[0] == 0:
        raise InputError("no rows to compute statistics from, on any rank")
    shift = seed[1:] / seed[0]
    n = 0
    total = torch.zeros(dim, dtype=torch.float64, device=dev)
    squares = torch.zeros(dim, dtype=torch.float64, device=dev)
    products = torch.zeros((dim, dim), dtype=torch.float64, device=dev) if outer else None
    abs_max = torch.zeros(1, dtype=torch.float64, device=dev)
    for block in itertools.chain([first] if first is not None else [], iterator):
        block = np.asarray(block)
        _check_block(block, dim)
        if not len(block):
            continue
        c = torch.from_numpy(block.astype(np.float64, copy=False)).to(dev) - shift
        n += len(block)
        total += c.sum(dim=0)
        squares += (c * c).sum(dim=0)
        if products is not None:
            products += c.T @ c
        abs_max = torch.maximum(abs_max, torch.tensor([float(np.abs(block).max())], dtype=torch.float64, device=dev))
    parts = [torch.tensor([float(n)], dtype=torch.float64, device=dev), total, squares]
    if products is not None:
        parts.append(products.reshape(-1))
    flat = torch.cat(parts)
    _all_reduce(flat)
    _all_reduce(abs_max, dist.ReduceOp.MAX if dist.is_available() else None)
    flat = flat.cpu().numpy()
    return Moments(
        n=int(round(flat[0])),
        shift=shift.cpu().numpy(),
        sum=flat[1 : dim + 1],
        sum_sq=flat[dim + 1 : 2 * dim + 1],
        sum_outer=flat[2 * dim + 1 :].reshape(dim, dim) if outer else None,
        abs_max=float(abs_max.item()),
    )


def _check_block(block: np.ndarray, dim: int) -> None:
    if block.ndim != 2 or block.shape[1] != dim:
        raise InputError(f"expected rows of shape [n, {dim}], got {block.shape}")
    if not np.isfinite(block).all():
        raise InputError("the embeddings contain NaN or Inf; the model or its input is broken")


def _all_reduce(tensor: torch.Tensor, op: Any = None) -> None:
    if _world()[1] > 1:
        dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM)


def _row_chunks(X: Any, start: int, stop: int, rows: int) -> Iterator[np.ndarray]:
    """Rows ``[start, stop)`` of an array-like (ndarray, memmap, ShardedEmbeddings) in blocks of ``rows``."""
    if hasattr(X, "iter_chunks"):
        yield from X.iter_chunks(start, stop, rows)
        return
    for a in range(start, stop, rows):
        yield np.asarray(X[a : min(a + rows, stop)])


def _take(X: Any, rows: np.ndarray) -> np.ndarray:
    """Rows at ``rows`` (any order) of an array-like, read in one pass."""
    if hasattr(X, "take") and not isinstance(X, np.ndarray):
        return X.take(rows)
    return np.asarray(X[rows])


def _check_matrix(X: Any) -> tuple[int, int]:
    shape = getattr(X, "shape", None)
    if shape is None or len(shape) != 2:
        raise InputError(f"expected an [N, D] array-like (ndarray, memmap, store), got {type(X).__name__}")
    return int(shape[0]), int(shape[1])


def fit_whitening_distributed(
    X: Any,
    calibrator: WhiteningCalibrator | None = None,
    *,
    chunk_rows: int = 65536,
    device: str | None = None,
) -> WhiteningCalibrator:
    """Fit whitening on a corpus split over the ranks; every rank returns the same fitted calibrator.

    Each rank streams its contiguous share of ``X`` and sums float64 moments; the all-reduced sums give the
    exact mean and covariance (:meth:`WhiteningCalibrator.fit_from_moments`), so the result equals
    ``WhiteningCalibrator().fit(np.asarray(X))`` up to rounding (about 1e-13 relative on real embeddings).

    Args:
        X: [N, D] rows readable by every rank, e.g. ``bertflow.store.open_embeddings(folder)`` on shared storage
            or a memory-mapped ``.npy``. For rows that only this rank holds, use :func:`all_reduce_moments` and
            ``fit_from_moments`` directly.
        calibrator: an unfitted :class:`WhiteningCalibrator` carrying the hyperparameters (default: keep all).
        chunk_rows: rows per block read from disk.
        device: where to accumulate the D x D products (default CPU).
    """
    from .calibrators import WhiteningCalibrator

    cal = calibrator if calibrator is not None else WhiteningCalibrator()
    n, d = _check_matrix(X)
    rank, world = _world()
    lo, hi = _share(n, rank, world)
    moments = all_reduce_moments(_row_chunks(X, lo, hi, chunk_rows), d, outer=True, device=device)
    return cal.fit_from_moments(moments.n, moments.sum, moments.sum_outer, shift=moments.shift)


class GradientAllReduce:
    """The ``reduce`` hook of ``FlowCalibrator._train``: sums every gradient and the loss term over the ranks.

    One all-reduce per step of a flat vector (all gradients, then the loss), so the Glow's ~150k gradients cost
    one message, not one per parameter. Every rank then holds identical gradients, clips them identically and
    takes the identical optimiser step, so the parameters never drift apart. With one process it is a no-op.
    """

    def __call__(self, glow: torch.nn.Module, local_loss: torch.Tensor) -> torch.Tensor:
        """All-reduce in place; returns the global batch loss (a 0-d tensor)."""
        params = [p for p in glow.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [local_loss.reshape(1).to(grads[0].dtype)])
        _all_reduce(flat)
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        return flat[-1]


def _rank_batches(
    X: Any,
    train_rows: np.ndarray,
    active: np.ndarray,
    index_batches: Iterator[torch.Tensor],
    rank: int,
    world: int,
    device: torch.device,
    read_steps: int,
) -> Iterator[torch.Tensor]:
    """This rank's rows of each global batch, read from ``X`` ``read_steps`` steps at a time in row order."""
    while True:
        block = [next(index_batches).numpy() for _ in range(read_steps)]
        # Contiguous split of each global batch: shares differ by at most one row.
        local = [np.array_split(train_rows[idx], world)[rank] for idx in block]
        wanted = np.concatenate(local)
        unique, inverse = np.unique(wanted, return_inverse=True)
        data = _take(X, unique)[:, active].astype(np.float32)
        pos = 0
        for part in local:
            sel = inverse[pos : pos + len(part)]
            pos += len(part)
            yield torch.from_numpy(data[sel]).to(device)


class _HeldOutScore:
    """Mean bits per dimension of the held-out rows, each rank scoring its share and the sums all-reduced."""

    def __init__(self, X: Any, rows: np.ndarray, active: np.ndarray, total: int, device: torch.device) -> None:
        self.X, self.rows, self.active, self.total, self.device = X, np.sort(rows), active, total, device
        self._cache: torch.Tensor | None = None
        # Hold the share in memory when it is small (the usual case); stream it from disk otherwise.
        if len(self.rows) * len(active) * 4 <= 512 * 2**20:
            self._cache = self._read(self.rows)

    def _read(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(_take(self.X, rows)[:, self.active].astype(np.float32)).to(self.device)

    @torch.no_grad()
    def __call__(self, glow: torch.nn.Module) -> float:
        was_training = glow.training
        glow.eval()
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        blocks = (
            [self._cache]
            if self._cache is not None
            else (self._read(r) for r in np.array_split(self.rows, max(1, len(self.rows) // 65536)))
        )
        for block in blocks:
            for part in block.split(65536):
                total += glow.bits_per_dim(part).double().sum()
        glow.train(was_training)
        _all_reduce(total)
        return float(total.item() / self.total)


def fit_flow_distributed(
    X: Any,
    calibrator: FlowCalibrator | None = None,
    *,
    device: str | None = None,
    chunk_rows: int = 65536,
    read_steps: int = 256,
) -> FlowCalibrator:
    """Fit BERT-flow on a corpus split over the ranks (data parallel); every rank returns the same flow.

    Reproduces ``FlowCalibrator.fit`` step for step: the constant dimensions come from all-reduced moments; the
    shuffle, held-out split and batch order are drawn from the same seeded generator on every rank, exactly as in
    one process; ActNorm's data-dependent initialisation runs on rank 0 on the same rows one process would use,
    and its parameters are broadcast; at every step each rank computes its contiguous share of the global batch
    of ``batch_size`` rows (read from disk), and the gradients are summed (:class:`GradientAllReduce`). The
    effective batch is therefore ``batch_size`` whatever the number of ranks, and the result equals the
    single-process fit up to floating-point summation order (which, compounded over the steps, leaves
    differences around 1e-6 relative in the latents: see the tests).

    Rows are read at random positions from ``X``, so every rank must be able to read all of it: a store on shared
    storage, or a copy per node. Memory per rank: the shuffled row order (8 bytes a row) and a few hundred steps
    of rows, not the corpus.

    Args:
        X: [N, D] rows readable by every rank (``bertflow.store.open_embeddings(folder)``, a memory-mapped
            ``.npy``, or an array).
        calibrator: an unfitted :class:`FlowCalibrator` carrying the hyperparameters (default: the code preset).
        device: this rank's device; default ``calibrator.device`` or ``cuda:{local_rank}`` / ``cpu``.
        chunk_rows: rows per block of the statistics pass.
        read_steps: steps of rows read from disk at a time (sorted, so a memory map is read front to back).

    Returns:
        The fitted calibrator (``n_features_in_``, ``flow_``, ``history_``... set as by ``fit``).
    """
    from .calibrators import FlowCalibrator
    from .calibrators.flow import _cpu_threads

    cal = calibrator if calibrator is not None else FlowCalibrator()
    n, d = _check_matrix(X)
    rank, world = _world()
    cal._check_params(np.empty((0, d)))
    if n < cal._min_rows():
        raise InputError(f"the flow needs at least {cal._min_rows()} rows, got {n}")
    if min(cal.batch_size, n) < world:
        raise InputError(f"batch_size ({cal.batch_size}) must be at least the number of ranks ({world})")
    dev = torch.device(device or cal.device or default_device())
    lo, hi = _share(n, rank, world)
    moments = all_reduce_moments(_row_chunks(X, lo, hi, chunk_rows), d, outer=False)
    cal._set_passthrough(moments.mean, moments.std, moments.abs_max, n)
    active = cal._active
    glow = cal._build_glow(len(active)).to(dev)
    # The same generator calls as FlowCalibrator._fit, so the split and every batch match one process.
    gen = torch.Generator().manual_seed(cal.seed)
    order = torch.randperm(n, generator=gen).numpy()
    n_val = int(round(cal.validation_fraction * n))
    val_rows, train_rows = order[:n_val], order[n_val:]
    if rank == 0:
        init = _take(X, train_rows[: cal.init_samples])[:, active].astype(np.float32)
        with torch.no_grad():
            glow.initialize(torch.from_numpy(init).to(dev))
    if world > 1:
        state = _broadcast_object({k: v.cpu() for k, v in glow.state_dict().items()} if rank == 0 else None)
        glow.load_state_dict(state)
    cal.flow_ = glow
    batches = _rank_batches(X, train_rows, active, cal._batches(len(train_rows), gen), rank, world, dev, read_steps)
    evaluate = None
    if n_val:
        vlo, vhi = _share(n_val, rank, world)
        evaluate = _HeldOutScore(X, np.sort(val_rows)[vlo:vhi], active, n_val, dev)
    verbose = cal.verbose
    cal.verbose = bool(verbose and rank == 0)
    try:
        with _cpu_threads(1 if dev.type == "cpu" else None):
            cal._train(
                glow,
                None,
                None,
                gen,
                batches=batches,
                n_train=len(train_rows),
                reduce=GradientAllReduce(),
                evaluate=evaluate,
            )
    finally:
        cal.verbose = verbose
    cal.flow_.eval()
    cal.n_features_in_ = d
    return cal
