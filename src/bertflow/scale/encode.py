"""Sharded encoding to disk (``bertflow distributed-encode``); for several devices of one machine in memory see
:func:`bertflow.encoding.multiprocess.encode_multi_device`. Shard boundaries are multiples of the encoder's chunk
size, so every forward pass sees exactly the sentences it would in one process: the store is bit for bit what
``SentenceEncoder.iter_encode`` (or ``bertflow encode``) gives on the same kind of device.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._version import __version__
from ..calibrators.base import calibrator_identity
from ..errors import CompatibilityError, InputError
from ..io.arrow import InputSource, open_input
from ..io.files import check_output_folder, folder_lock
from ..model_folder import LATER_ENCODER_KEYS
from ..resources import share
from .launch import all_gather_object, barrier, rank_and_world, run_on_main
from .layout import (
    DEFAULT_SHARD_SIZE,
    MANIFEST_NAME,
    MERGED_NAME,
    SHARD_DIR,
    ShardSpec,
    check_store_options,
    finalize_manifest,
    new_manifest,
    plan_shards,
    read_manifest,
    remove_temporary_files,
    shard_record,
    write_manifest,
)
from .shards import open_shard_writer
from .store import merge_shards

if TYPE_CHECKING:
    from ..calibrators import Calibrator
    from ..encoding.encoder import SentenceEncoder

logger = logging.getLogger(__name__)


#: Manifest fields that a resumed run must reproduce exactly (otherwise its shards would not fit together). The
#: library version is not one: a store half encoded by one bertflow release is resumed by the next (the encoder and
#: the calibrator are recorded by fingerprints that do not depend on it, ``bertflow.model_folder.encoder_record``).
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
    "shard_format",
    "id_column",
)


#: Chunks of its first shard that a CUDA rank encodes (and discards) before the timed phase.
WARMUP_CHUNKS = 3


def _warm_up(encoder: SentenceEncoder, plan: StorePlan, mine: Sequence[ShardSpec]) -> float:
    """On CUDA, run the first chunks of the rank's first shard through the encode loop (vectors discarded) before
    the timed phase: a cold rank's start-up (tokeniser workers, kernels, the calibrator's CUDA graph) made its first
    shard run at under half speed, and belongs to loading. Returns seconds."""
    if not mine or getattr(encoder, "device", torch.device("cpu")).type != "cuda":
        return 0.0
    from ..embedder import iter_calibrated

    t = time.perf_counter()
    first = mine[0]
    # A few chunks, so that as many are in flight as in the timed loop (their pinned host buffers are allocated
    # here, and cached for it), as a stream (iter), which starts the tokeniser workers.
    stop = min(first.stop, first.start + WARMUP_CHUNKS * plan.encode_kwargs["chunk_size"])
    lines = plan.source.read(first.start, stop, first.offset)
    for _ in iter_calibrated(encoder, plan.calibrator, iter(lines), **plan.encode_kwargs):
        pass
    return time.perf_counter() - t


def _normalised(data: dict[str, Any]) -> dict[str, Any]:
    # JSON round trip: tuples become lists, as they will be when read back from the manifest.
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _same_setting(key: str, recorded: Any, current: Any) -> bool:
    """Whether a store's recorded setting ``key`` matches the current run's. An encoder record written before a
    key of :data:`~bertflow.model_folder.LATER_ENCODER_KEYS` existed is compared without it, so a store half-encoded by
    an earlier bertflow still resumes."""
    if key == "encoder" and isinstance(recorded, dict) and isinstance(current, dict):
        current = {k: v for k, v in current.items() if k in recorded or k not in LATER_ENCODER_KEYS}
    return recorded == current


@dataclass(frozen=True)
class StorePlan:
    """One rank's part of :func:`encode_file_to_store` (same names), checked before any work. ``identity``: the
    settings the manifest records and a resumed run must repeat (:data:`IDENTITY_KEYS`), ``dim`` the row width;
    ``encode_kwargs``: ``chunk_size`` (and ``batch_size`` when given) for the encode loop."""

    source: InputSource
    folder: Path
    calibrator: Calibrator | None
    identity: dict[str, Any]
    encode_kwargs: dict[str, int]
    shard_size: int
    overwrite: bool
    id_column: str | None

    @property
    def dim(self) -> int:
        return int(self.identity["dim"])


def _open_store(plan: StorePlan, lock: contextlib.ExitStack) -> tuple[dict[str, Any], list[int]]:
    """Rank 0: take the store's lock (held by ``lock`` until the run ends), index the input, create or check the
    manifest, clear stale temporaries; return (manifest, indices of the shards done)."""
    folder, identity = plan.folder, plan.identity
    # A store is resumed (or started afresh with overwrite); a file or a folder holding anything else is refused.
    check_output_folder(folder, "store", resume=True, inputs=[plan.source.path])
    folder.mkdir(parents=True, exist_ok=True)
    lock.enter_context(folder_lock(folder, "distributed-encode run"))
    has_manifest = (folder / MANIFEST_NAME).is_file()
    if plan.overwrite:  # the manifest goes last: until then the folder is still a store
        shutil.rmtree(folder / SHARD_DIR, ignore_errors=True)
        for name in (MERGED_NAME, MANIFEST_NAME):
            (folder / name).unlink(missing_ok=True)
        has_manifest = False
    index = plan.source.index(plan.shard_size)  # a text file's lines or a table's text column (bertflow.io.arrow)
    if index.rows == 0:
        raise InputError(f"{plan.source.path} has no {'lines' if index.offsets is not None else 'rows'} to encode")
    specs = plan_shards(index.rows, plan.shard_size, index.offsets, shard_format=identity.get("shard_format", "npy"))
    fresh = new_manifest(
        rows=index.rows,
        specs=specs,
        shard_size=plan.shard_size,
        input=index.record,
        input_path=str(plan.source.path.resolve()),
        **identity,
    )
    fresh = _normalised(fresh)
    if has_manifest:
        manifest = read_manifest(folder)
        differ = [k for k in IDENTITY_KEYS if not _same_setting(k, manifest.get(k), fresh.get(k))]
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
    else:
        manifest = fresh
    write_manifest(folder, manifest)
    if removed := remove_temporary_files(folder):
        logger.info("%s: removed %d temporary file(s) left by an interrupted run", folder, removed)
    done = [s.index for s in specs if shard_record(folder, s, manifest["dim"], manifest["dtype"]) is not None]
    return manifest, done


def _check_same_as_rank_0(manifest: dict[str, Any], plan: StorePlan, rank: int) -> None:
    """Every rank must encode with what rank 0 recorded in the manifest: same weights, pooling, precision,
    calibrator. Raises :class:`CompatibilityError` otherwise."""
    ours = _normalised(plan.identity)
    if any(not _same_setting(k, manifest.get(k), ours[k]) for k in ours if k != "dim") or manifest["dim"] != plan.dim:
        raise CompatibilityError(
            f"rank {rank}: this rank's encoder or calibrator differs from rank 0's (model files differ between "
            "nodes, or another dtype was picked); every rank must use the same model and options"
        )


def _encode_shards(
    encoder: SentenceEncoder, plan: StorePlan, mine: Sequence[ShardSpec], record: dict[str, Any], progress: Any
) -> list[tuple[int, float]]:
    """Encode the shards ``mine`` into the store, in order, as one stream through the encode-then-calibrate loop
    (the pipeline does not drain at shard boundaries); returns (rows, seconds) per shard."""
    from ..embedder import iter_calibrated

    source, dim = plan.source, plan.dim

    def rank_lines() -> Iterator[str]:
        for spec in mine:
            yield from source.read(spec.start, spec.stop, spec.offset)

    shard_times = []
    stream = iter_calibrated(encoder, plan.calibrator, rank_lines(), **plan.encode_kwargs, progress=progress)
    left = np.empty((0, dim), dtype=np.float32)  # rows of a part that belong to the next shard
    with ThreadPoolExecutor(1, thread_name_prefix="shard-commit") as committer:
        # A shard's commit (fsync, rename, record) runs on the committer thread while the next shard is encoded:
        # done inline it stopped this loop, and with it the launching of forward passes, for each shard's fsync.
        committing: Future[dict[str, Any]] | None = None
        for spec in mine:
            t_shard = time.perf_counter()
            ids = (plan.id_column, source.read_ids(spec.start, spec.stop)) if plan.id_column is not None else None
            writer = open_shard_writer(plan.folder, spec, dim, record=record, ids=ids)
            try:
                need = spec.rows
                while need:
                    part = left if len(left) else next(stream)
                    writer.write(part[:need])
                    left, need = part[need:], need - min(need, len(part))
                if committing is not None:
                    committing.result()  # one shard commits at a time: bounded memory, errors surface here
            except BaseException:
                writer.abort()
                raise
            committing = committer.submit(writer.commit)
            shard_times.append((spec.rows, time.perf_counter() - t_shard))
        if committing is not None:
            committing.result()
    return shard_times


def _run_rank(
    encoder: SentenceEncoder, plan: StorePlan, mine: Sequence[ShardSpec], *, show_progress: bool
) -> tuple[dict[str, Any], float]:
    """This rank's timed phase: warm up, wait for every rank, encode ``mine``. Returns the rank's summary and the
    ``time.perf_counter()`` at which the timed phase started (the same moment on every rank, after a barrier)."""
    from tqdm.auto import tqdm

    rank, world = rank_and_world()
    record = {"rank": rank, "world_size": world, "device": str(getattr(encoder, "device", "unknown"))}
    warmup = _warm_up(encoder, plan, mine)
    barrier()  # every rank has its encoder loaded, warmed and its plan: the timed phase starts together
    t0 = time.perf_counter()
    total = sum(s.rows for s in mine)
    with tqdm(
        total=total, desc=f"encode (rank 0 of {world})", unit="sent", disable=not (show_progress and rank == 0)
    ) as bar:
        shard_times = _encode_shards(encoder, plan, mine, record, bar.update)
    summary = {
        "rank": rank,
        "device": record["device"],
        "shards": len(mine),
        "rows": sum(r for r, _ in shard_times),
        "seconds": round(time.perf_counter() - t0, 4),
        "shard_rows": [r for r, _ in shard_times],
        "shard_seconds": [round(t, 4) for _, t in shard_times],
        "warmup_seconds": round(warmup, 4),
    }
    return summary, t0


def encode_file_to_store(
    input_path: str | Path,
    folder: str | Path,
    encoder: SentenceEncoder,
    *,
    calibrator: Calibrator | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    chunk_size: int = 16384,
    batch_size: int | None = None,
    encoding_errors: str = "strict",
    overwrite: bool = False,
    merge: bool = False,
    show_progress: bool = False,
    text_column: str | None = None,
    input_format: str | None = None,
    shard_format: str = "npy",
    id_column: str | None = None,
) -> dict[str, Any]:
    """Encode every line of a text file (or every row of a table's text column) into an embedding store, this
    process being one rank of the job; call it on every rank (inside :func:`process_group`, or alone). Returns a
    JSON-ready summary: of the whole run on rank 0, of this rank's work on the others.

    ``input_path`` is UTF-8 text, one sentence per line (a blank line is an error: row ``i`` is line ``i + 1``), or a
    Parquet / Arrow IPC file whose ``text_column`` is encoded row by row (``input_format``: ``"text"``,
    ``"parquet"`` or ``"arrow"``; default from the suffix); ``folder`` is the store (:mod:`bertflow.scale.store`).
    ``encoder`` is this rank's, on its device; ``calibrator``, if any, is applied to every chunk. ``shard_size`` is a
    multiple of ``chunk_size``; with the ``chunk_size`` and ``batch_size`` (None: the encoder's token budget) of
    ``encoder.iter_encode`` the store is bit-identical to it on the same kind of device. ``overwrite`` starts an
    existing store afresh instead of resuming it; ``merge`` also writes ``embeddings.npy`` (rank 0); ``shard_format``
    is ``"npy"``, ``"parquet"`` or ``"arrow"``, and ``id_column`` a table column copied beside each vector.

    Rank 0 indexes the input and writes the manifest; the shards not yet complete are split into contiguous
    blocks, one per rank, each written atomically; after a barrier rank 0 completes the manifest and optionally
    merges. Re-running the same call resumes: complete shards are skipped. InputError: a bad input file or option
    (before any work), or a store in ``folder`` made with other settings.
    """
    from ..calibrators import IdentityCalibrator

    check_store_options(
        shard_size=shard_size,
        chunk_size=chunk_size,
        batch_size=batch_size,
        encoding_errors=encoding_errors,
        shard_format=shard_format,
        id_column=id_column,
    )
    if isinstance(calibrator, IdentityCalibrator):
        calibrator = None
    input_path = Path(input_path)
    source = open_input(
        input_path,
        text_column=text_column,
        input_format_name=input_format,
        id_column=id_column,
        encoding_errors=encoding_errors,
    )
    identity = _store_identity(encoder, calibrator, chunk_size, batch_size, encoding_errors, shard_format, id_column)
    if not input_path.is_file():
        raise InputError(f"cannot read {input_path}: no such file")
    # batch_size only when given: then the encoder's own default batching applies (a token budget).
    encode_kwargs = {"chunk_size": int(chunk_size)} | ({"batch_size": int(batch_size)} if batch_size else {})
    plan = StorePlan(source, Path(folder), calibrator, identity, encode_kwargs, int(shard_size), overwrite, id_column)
    rank, world = rank_and_world()
    started = time.time()
    # Rank 0 holds FOLDER/.lock for the whole run: a second run on the same store stops with a clear error instead
    # of deleting this run's temporary files and racing it for the shards.
    with contextlib.ExitStack() as lock:
        manifest, done = run_on_main(lambda: _open_store(plan, lock))
        _check_same_as_rank_0(manifest, plan, rank)
        specs = [ShardSpec.from_json(e) for e in manifest["shards"]]
        done_set = set(done)
        todo = [s for s in specs if s.index not in done_set]
        lo, hi = share(len(todo), rank, world)
        mine_summary, t0 = _run_rank(encoder, plan, todo[lo:hi], show_progress=show_progress)
        barrier()  # all shards written
        wall = time.perf_counter() - t0
        per_rank = all_gather_object(mine_summary)
        if rank != 0:
            return mine_summary
        return _finish_run(plan, len(specs), len(todo), len(done), per_rank, started, wall, merge)


def _store_identity(
    encoder: SentenceEncoder,
    calibrator: Calibrator | None,
    chunk_size: int,
    batch_size: int | None,
    encoding_errors: str,
    shard_format: str,
    id_column: str | None,
) -> dict[str, Any]:
    """What makes a store's vectors what they are (its manifest's identity): a resumed run must match it."""
    return {
        "encoder": encoder.get_config(),
        "compute_dtype": str(getattr(encoder, "dtype", "unknown")).replace("torch.", ""),
        "calibrator": calibrator_identity(calibrator) if calibrator is not None else None,
        "dim": int(calibrator.n_features_out_) if calibrator is not None else int(encoder.dim),
        "dtype": "float32",
        "chunk_size": int(chunk_size),
        "batch_size": batch_size,
        # The encoder's padded-token budget per forward pass shapes the batches too (None: its device default).
        "max_tokens": getattr(encoder, "max_tokens", None),
        "encoding_errors": encoding_errors,
        # Only when not the default, so that .npy stores keep the manifest (and resume) they always had.
        **({"shard_format": shard_format} if shard_format != "npy" else {}),
        **({"id_column": id_column} if id_column is not None else {}),
    }


def _finish_run(
    plan: StorePlan,
    shards: int,
    encoded: int,
    skipped: int,
    per_rank: list[dict[str, Any]],
    started: float,
    wall: float,
    merge: bool,
) -> dict[str, Any]:
    """Rank 0, after every shard is written: complete the manifest, merge if asked, and summarise the run."""
    counts = {"encoded_shards": encoded, "skipped_shards": skipped}
    world = len(per_rank)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    run = {"started_at": started_at, "world_size": world, **counts, "seconds": round(wall, 4)}
    final = finalize_manifest(plan.folder, run={**run, "host": socket.gethostname(), "bertflow_version": __version__})
    encoded_rows = sum(r["rows"] for r in per_rank)
    return {
        "output": str(plan.folder),
        "rows": final["rows"],
        "dim": final["dim"],
        "shards": shards,
        **counts,
        "encoded_rows": encoded_rows,
        "world_size": world,
        "seconds": round(wall, 4),
        "rows_per_second": round(encoded_rows / wall, 2) if wall > 0 and encoded_rows else None,
        "merged": str(merge_shards(plan.folder)) if merge else None,
        "per_rank": per_rank,
    }
