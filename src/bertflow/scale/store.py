"""Embedding stores: a folder of ``.npy`` shards plus a JSON manifest, read back as one array in input order.

Written by :func:`bertflow.scale.encode.encode_file_to_store` (``bertflow distributed-encode``), one shard file at a
time by whichever rank encoded it, or by :func:`write_store` from an in-memory matrix. Layout::

    OUTDIR/
      manifest.json            what was encoded and how (input file size, sha256 and line count; encoder model id,
                               fingerprint, pooling, max_length and compute dtype; calibrator identity, if any;
                               output dim and dtype; bertflow version) and the shard plan: the row range
                               [start, stop) and input byte offset of every shard
      shards/part-000000.npy   float32 [rows, D]: input rows [start, stop), in input order
      shards/part-000000.json  the shard's completion record: rows, bytes, sha256, rank, device, seconds
      embeddings.npy           only after a merge (``--merge`` or :func:`merge_shards`): every row in one array

A store may hold Parquet or Arrow IPC shards instead (``shard_format`` in the manifest, ``--format parquet|arrow``):
``shards/part-000000.parquet`` (or ``.arrow``) is a table of ``row`` (int64), an optional id column copied from the
input, and ``embedding`` (fixed_size_list<float32>[D]), written and completed the same way (see
:mod:`bertflow.io.arrow`). Such a store has ``format_version`` 2, so a bertflow that only reads ``.npy`` shards
refuses it by name instead of reporting missing shards.

Shards are numbered over the whole input, not per rank, so a run resumed with another number of ranks still
reuses every finished shard. A shard is complete when its record exists and its ``.npy`` has the recorded size:
the ``.npy`` is written under a temporary name, fsynced and renamed, and only then is its record written (the same
way), so a killed writer leaves a temporary file that the next run deletes and redoes, never a short shard.

Reading: :func:`open_embeddings` returns a :class:`ShardedEmbeddings`, which indexes like a read-only ``[N, D]``
array (memory-mapped, so only the rows asked for are read) without concatenating the shards.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import itertools
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import InputError, ModelFileError
from ..io.files import FOLDER_KINDS, TMP_MARK, atomic_file, atomic_write_text, fsync_dir, temporary_name
from ..io.formats import check_format, sha256_file

__all__ = [
    "MANIFEST_NAME",
    "SHARD_DIR",
    "MERGED_NAME",
    "STORE_FORMAT",
    "STORE_FORMAT_VERSION",
    "ShardSpec",
    "ShardWriter",
    "TableShardWriter",
    "open_shard_writer",
    "SHARD_SUFFIXES",
    "ShardedEmbeddings",
    "open_embeddings",
    "merge_shards",
    "write_store",
    "read_manifest",
    "write_manifest",
    "shard_record",
    "plan_shards",
    "remove_temporary_files",
]

MANIFEST_NAME = FOLDER_KINDS["store"][0]  # "manifest.json"
SHARD_DIR = "shards"
MERGED_NAME = "embeddings.npy"
STORE_FORMAT = FOLDER_KINDS["store"][2]  # "bertflow-embeddings"
#: Version of the store layout; reading refuses a larger number. 1: ``.npy`` shards; 2: Parquet/Arrow shards too.
STORE_FORMAT_VERSION = 2
#: Shard file formats and their suffixes (``npy`` is the default and memory-maps; the others are for other tools).
SHARD_SUFFIXES = {"npy": ".npy", "parquet": ".parquet", "arrow": ".arrow"}

# -- small file helpers ---------------------------------------------------------------------------------------


def _dump_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when it is missing or unreadable (an incomplete record)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(folder: str | Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` into ``folder`` atomically (key-sorted, indented UTF-8 JSON)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / MANIFEST_NAME, _dump_json(manifest))


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """Read and check a store's ``manifest.json``.

    Raises:
        ModelFileError: the file is missing or garbled, is not a bertflow store, or was written in a newer format.
    """
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise ModelFileError(f"{path} is missing: {folder} is not a bertflow embedding store (or was never started)")
    data = _read_json(path)
    if data is None:
        raise ModelFileError(f"{path} is not valid JSON; the file is corrupted or was edited")
    if data.get("format") != STORE_FORMAT:
        raise ModelFileError(f"{path} is not a bertflow embedding-store manifest")
    check_format(data, path, kind="embedding store", current=STORE_FORMAT_VERSION)
    for key in ("rows", "dim", "dtype", "shards"):
        if key not in data:
            raise ModelFileError(f"{path} lacks {key!r}; was it edited?")
    return data


# -- the shard plan ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardSpec:
    """One shard of the plan: input rows ``[start, stop)``; ``offset`` is the byte where row ``start`` begins.

    Attributes:
        index: global shard number (its file is ``shards/part-{index:06d}{suffix}``).
        start, stop: row range, 0-based, ``stop`` excluded.
        offset: byte offset of the input line of row ``start`` (0 when the rows did not come from a text file).
        suffix: the shard file's suffix, which names its format (:data:`SHARD_SUFFIXES`).
    """

    index: int
    start: int
    stop: int
    offset: int = 0
    suffix: str = ".npy"

    @property
    def rows(self) -> int:
        """Number of rows in the shard."""
        return self.stop - self.start

    @property
    def name(self) -> str:
        """File name of the shard's array, ``part-{index:06d}.npy`` (or ``.parquet``, ``.arrow``)."""
        return f"part-{self.index:06d}{self.suffix}"

    @property
    def format(self) -> str:
        """The shard's file format: ``"npy"``, ``"parquet"`` or ``"arrow"``."""
        return self.suffix.lstrip(".")

    @property
    def record_name(self) -> str:
        """File name of the shard's completion record, ``part-{index:06d}.json``."""
        return f"part-{self.index:06d}.json"

    def to_json(self) -> dict[str, Any]:
        """The manifest entry of this shard."""
        entry = asdict(self)
        del entry["suffix"]  # the file name carries it
        return {**entry, "file": f"{SHARD_DIR}/{self.name}"}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> ShardSpec:
        """Rebuild a spec from its manifest entry."""
        suffix = Path(entry.get("file", ".npy")).suffix or ".npy"
        return cls(int(entry["index"]), int(entry["start"]), int(entry["stop"]), int(entry.get("offset", 0)), suffix)


def plan_shards(
    n_rows: int, shard_size: int, offsets: Sequence[int] | None = None, *, shard_format: str = "npy"
) -> list[ShardSpec]:
    """Cut ``n_rows`` rows into shards of ``shard_size`` rows (the last one shorter).

    Args:
        n_rows: total rows N.
        shard_size: rows per shard, positive.
        offsets: byte offset of the first line of every shard (``ceil(N / shard_size)`` values), if from a file.
        shard_format: ``"npy"``, ``"parquet"`` or ``"arrow"`` (:data:`SHARD_SUFFIXES`).
    """
    if shard_size < 1:
        raise InputError(f"shard_size must be positive, got {shard_size}")
    if shard_format not in SHARD_SUFFIXES:
        raise InputError(f"the shard format must be one of {', '.join(SHARD_SUFFIXES)}, got {shard_format!r}")
    suffix = SHARD_SUFFIXES[shard_format]
    count = -(-n_rows // shard_size)
    if offsets is not None and len(offsets) != count:
        raise ValueError(f"{count} shards need {count} offsets, got {len(offsets)}")
    return [
        ShardSpec(
            k, k * shard_size, min((k + 1) * shard_size, n_rows), int(offsets[k]) if offsets is not None else 0, suffix
        )
        for k in range(count)
    ]


def shard_record(folder: str | Path, spec: ShardSpec, dim: int, dtype: str = "float32") -> dict[str, Any] | None:
    """The completion record of shard ``spec`` if the shard is complete and matches the plan, else ``None``.

    Complete means: the record parses, names the same rows, dimension and dtype, and the ``.npy`` exists with the
    recorded byte size and an array header of shape ``[rows, dim]`` (a Parquet/Arrow shard: the recorded size, and
    metadata saying ``rows`` rows of float32 [dim]). The checksum is not recomputed here (that reads the whole
    shard); :meth:`ShardedEmbeddings.verify` does it.
    """
    shard_dir = Path(folder) / SHARD_DIR
    record = _read_json(shard_dir / spec.record_name)
    if record is None:
        return None
    expected = {"index": spec.index, "start": spec.start, "stop": spec.stop, "dim": dim, "dtype": dtype}
    if any(record.get(k) != v for k, v in expected.items()):
        return None
    path = shard_dir / spec.name
    try:
        if path.stat().st_size != record.get("bytes"):
            return None
        if spec.format != "npy":
            from ..io.arrow import embedding_table_rows

            return record if dtype == "float32" and embedding_table_rows(path, spec.format, dim) == spec.rows else None
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _, file_dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _, file_dtype = np.lib.format.read_array_header_2_0(fh)
    except (OSError, ValueError):
        return None
    if tuple(shape) != (spec.rows, dim) or file_dtype != np.dtype(dtype):
        return None
    return record


def remove_temporary_files(folder: str | Path) -> int:
    """Delete the temporary files that killed writers left in a store; returns how many.

    Only safe while no other run writes into the same folder (one run per store at a time).
    """
    removed = 0
    for path in (Path(folder), Path(folder) / SHARD_DIR):
        if not path.is_dir():
            continue
        for f in path.iterdir():
            if f.name.startswith(".") and TMP_MARK in f.name and f.is_file():
                f.unlink(missing_ok=True)
                removed += 1
    return removed


# -- writing ----------------------------------------------------------------------------------------------------


class ShardWriter:
    """Write one shard: a ``.npy`` header, the rows as they come, then fsync, rename and the completion record.

    Rows are written and hashed by a background thread, so disk and checksum overlap the encoding of the next
    rows. Nothing under the final names exists until :meth:`commit` returns; leaving the ``with`` block by an
    exception deletes the temporary file.

    Args:
        folder: the store folder (``shards/`` is created inside it).
        spec: which shard.
        dim: row dimension D.
        dtype: stored dtype (float32 by default).
        record: extra JSON-ready fields for the completion record (rank, device, host...).
        background: write in a background thread (``False`` writes inline).

    Example:
        >>> with ShardWriter("out", ShardSpec(0, 0, 3), dim=2) as w:
        ...     w.write(np.zeros((3, 2), np.float32))
        ...     w.commit()
    """

    def __init__(
        self,
        folder: str | Path,
        spec: ShardSpec,
        dim: int,
        dtype: str = "float32",
        *,
        record: dict[str, Any] | None = None,
        background: bool = True,
    ) -> None:
        self.folder = Path(folder)
        self.spec = spec
        self.dim = int(dim)
        self.dtype = np.dtype(dtype)
        self.extra = dict(record or {})
        self.shard_dir = self.folder / SHARD_DIR
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.shard_dir / spec.name
        self.tmp = temporary_name(self.path)
        self._written = 0  # rows handed to write()
        self._started = time.perf_counter()
        self._open()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shard-writer") if background else None
        self._pending: list[concurrent.futures.Future[None]] = []
        self._done = False

    # The file itself (an .npy here; TableShardWriter overrides these four for Parquet/Arrow).

    def _open(self) -> None:
        """Start the temporary file: the ``.npy`` header."""
        self._fh = open(self.tmp, "wb")  # noqa: SIM115 - closed by commit/abort
        self._hash = hashlib.sha256()
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.spec.rows, self.dim),
        }
        np.lib.format.write_array_header_1_0(self._fh, header)
        self._fh.flush()
        with open(self.tmp, "rb") as fh:  # hash the header too: the sha256 is that of the whole file
            self._hash.update(fh.read())

    def _write_block(self, block: np.ndarray) -> None:
        data = memoryview(block).cast("B")
        self._fh.write(data)
        self._hash.update(data)

    def _finish(self) -> tuple[int, str]:
        """Flush, fsync and rename the file to its final name; return its size and sha256."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        size = self._fh.tell()
        self._fh.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.shard_dir)
        return size, self._hash.hexdigest()

    def _discard(self) -> None:
        self._fh.close()
        self.tmp.unlink(missing_ok=True)

    def write(self, rows: np.ndarray) -> None:
        """Append rows [n, D] (converted to the store dtype; do not modify the array afterwards)."""
        if self._done:
            raise RuntimeError("this shard was already committed or aborted")
        block = np.ascontiguousarray(rows, dtype=self.dtype)
        if block.ndim != 2 or block.shape[1] != self.dim:
            raise InputError(f"shard {self.spec.index}: expected rows of shape [n, {self.dim}], got {block.shape}")
        if self._written + len(block) > self.spec.rows:
            raise InputError(
                f"shard {self.spec.index} holds {self.spec.rows} rows; writing {len(block)} more after "
                f"{self._written} overflows it"
            )
        self._written += len(block)
        if self._pool is None:
            self._write_block(block)
            return
        self._pending.append(self._pool.submit(self._write_block, block))
        # Keep at most two blocks in flight, so memory stays bounded if the disk is slower than the encoder.
        while len(self._pending) > 2:
            self._pending.pop(0).result()

    def commit(self) -> dict[str, Any]:
        """Finish the shard: wait for the writes, fsync, rename to the final name, write the record; return it.

        Raises:
            InputError: fewer rows were written than the shard holds.
        """
        if self._done:
            raise RuntimeError("this shard was already committed or aborted")
        for future in self._pending:
            future.result()
        self._pending.clear()
        if self._written != self.spec.rows:
            raise InputError(f"shard {self.spec.index} got {self._written} rows, expected {self.spec.rows}")
        self._shutdown()
        size, digest = self._finish()
        record = {
            "index": self.spec.index,
            "start": self.spec.start,
            "stop": self.spec.stop,
            "rows": self.spec.rows,
            "dim": self.dim,
            "dtype": self.dtype.name,
            "file": self.spec.name,
            "bytes": size,
            "sha256": digest,
            "seconds": round(time.perf_counter() - self._started, 4),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": socket.gethostname(),
            **self.extra,
        }
        # The record goes last: a crash before this line leaves a shard that the next run redoes.
        atomic_write_text(self.shard_dir / self.spec.record_name, _dump_json(record))
        self._done = True
        return record

    def abort(self) -> None:
        """Drop the shard: stop the writer and delete the temporary file."""
        if self._done:
            return
        self._done = True
        for future in self._pending:
            future.cancel()
        self._shutdown()
        self._discard()

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._done:
            self.abort()


class TableShardWriter(ShardWriter):
    """A :class:`ShardWriter` for a Parquet or Arrow IPC shard (``spec.suffix``): same use, record and atomicity.

    The table (:class:`bertflow.io.arrow.EmbeddingTableWriter`: ``row``, the id column if any, ``embedding``) is
    written through :func:`~bertflow.io.files.atomic_file`, one row group or record batch per :meth:`write`.

    Args:
        ids: ``(name, values)``: a column copied beside the embeddings, ``values`` a pyarrow array of the shard's
            rows (``spec.rows`` of them).
        the others: as for :class:`ShardWriter` (``dtype`` must be float32).
    """

    def __init__(
        self,
        folder: str | Path,
        spec: ShardSpec,
        dim: int,
        dtype: str = "float32",
        *,
        record: dict[str, Any] | None = None,
        background: bool = True,
        ids: tuple[str, Any] | None = None,
    ) -> None:
        if np.dtype(dtype) != np.float32:
            raise InputError(f"Parquet and Arrow shards hold float32 embeddings, not {dtype}")
        if ids is not None and len(ids[1]) != spec.rows:
            raise InputError(f"shard {spec.index} holds {spec.rows} rows but got {len(ids[1])} ids")
        self._ids = ids
        super().__init__(folder, spec, dim, dtype, record=record, background=background)

    def _open(self) -> None:
        from ..io.arrow import EmbeddingTableWriter, pyarrow

        self._stack = contextlib.ExitStack()
        self._fh = self._stack.enter_context(atomic_file(self.path, "wb"))
        id_field = pyarrow().field(self._ids[0], self._ids[1].type) if self._ids is not None else None
        self._table = EmbeddingTableWriter(self._fh, self.spec.format, self.dim, id_field)
        self._row = self.spec.start

    def _write_block(self, block: np.ndarray) -> None:
        local = self._row - self.spec.start
        ids = self._ids[1].slice(local, len(block)) if self._ids is not None else None
        self._table.write(self._row, block, ids)
        self._row += len(block)

    def _finish(self) -> tuple[int, str]:
        digest = self._table.close()
        size = self._fh.tell()
        self._stack.close()  # atomic_file: fsync, rename, fsync the folder
        return size, digest

    def _discard(self) -> None:
        # Close the table writer while its file is open (pyarrow would write to a closed file when it is collected),
        # then leave atomic_file by an exception, which deletes the temporary file.
        with contextlib.suppress(Exception):
            self._table.close()
        self._stack.__exit__(RuntimeError, RuntimeError("shard aborted"), None)


def open_shard_writer(
    folder: str | Path,
    spec: ShardSpec,
    dim: int,
    *,
    record: dict[str, Any] | None = None,
    ids: tuple[str, Any] | None = None,
) -> ShardWriter:
    """The writer of shard ``spec`` in its format: a :class:`ShardWriter` (``.npy``) or a :class:`TableShardWriter`.

    Raises:
        InputError: ``ids`` for an ``.npy`` shard (it has no place for them).
    """
    if spec.format == "npy":
        if ids is not None:
            raise InputError("an id column can only be stored in Parquet or Arrow shards (--format parquet|arrow)")
        return ShardWriter(folder, spec, dim, record=record)
    return TableShardWriter(folder, spec, dim, record=record, ids=ids)


def write_store(
    X: np.ndarray,
    folder: str | Path,
    *,
    shard_size: int = 131072,
    info: dict[str, Any] | None = None,
) -> ShardedEmbeddings:
    """Save an in-memory embedding matrix [N, D] as a store (for tests, or to fit distributed on it).

    Args:
        X: the rows, any float dtype; stored as float32.
        folder: the store folder; created, and must not hold another store.
        shard_size: rows per shard.
        info: extra JSON-ready fields for the manifest (``encoder``, ``input``...).

    Returns:
        The store, opened.
    """
    X = np.asarray(X)
    if X.ndim != 2:
        raise InputError(f"expected an [N, D] matrix, got shape {X.shape}")
    folder = Path(folder)
    if (folder / MANIFEST_NAME).exists():
        raise InputError(f"{folder} already holds an embedding store; use another folder")
    specs = plan_shards(len(X), shard_size)
    manifest = new_manifest(rows=len(X), dim=X.shape[1], specs=specs, shard_size=shard_size, **(info or {}))
    write_manifest(folder, manifest)
    for spec in specs:
        with ShardWriter(folder, spec, X.shape[1], background=False) as writer:
            writer.write(X[spec.start : spec.stop])
            writer.commit()
    finalize_manifest(folder)
    return open_embeddings(folder)


def new_manifest(
    *, rows: int, dim: int, specs: Sequence[ShardSpec], shard_size: int, dtype: str = "float32", **info: Any
) -> dict[str, Any]:
    """A manifest for a store about to be written (``complete`` is false until :func:`finalize_manifest`)."""
    return {
        "format": STORE_FORMAT,
        # Version 1 still describes an .npy store exactly, so bertflow versions that know only 1 keep reading it.
        "format_version": 1 if info.get("shard_format", "npy") == "npy" else STORE_FORMAT_VERSION,
        "bertflow_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": int(rows),
        "dim": int(dim),
        "dtype": dtype,
        "shard_size": int(shard_size),
        "shards": [s.to_json() for s in specs],
        "complete": False,
        **info,
    }


def finalize_manifest(folder: str | Path, *, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Mark a store complete: copy every shard's record (bytes, sha256) into the manifest and set ``complete``.

    Args:
        folder: the store.
        run: a JSON-ready description of the run that completed it, appended to ``runs``.

    Raises:
        InputError: some shard is not complete (the message lists them).
    """
    manifest = read_manifest(folder)
    specs = [ShardSpec.from_json(e) for e in manifest["shards"]]
    missing, entries = [], []
    for spec in specs:
        record = shard_record(folder, spec, manifest["dim"], manifest["dtype"])
        if record is None:
            missing.append(spec.index)
            continue
        entries.append({**spec.to_json(), "bytes": record["bytes"], "sha256": record["sha256"]})
    if missing:
        raise InputError(f"{folder}: {len(missing)} of {len(specs)} shard(s) are not complete: {_short(missing)}")
    manifest["shards"] = entries
    manifest["complete"] = True
    if run is not None:
        manifest.setdefault("runs", []).append(run)
    write_manifest(folder, manifest)
    return manifest


def _short(items: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" ... ({len(items)} in all)" if len(items) > limit else "")


# -- reading ----------------------------------------------------------------------------------------------------


class ShardedEmbeddings:
    """A read-only ``[N, D]`` view of a store's shards in input order, indexed like a numpy array.

    Every ``.npy`` shard is memory-mapped on first use, so indexing reads only the rows asked for (a Parquet or Arrow
    shard is read whole, and at most two are kept in memory). Supported indices: an
    integer (a row [D]), a slice (with any step), an integer array or list (rows in the order given), and a tuple
    ``(rows, columns)`` whose column part is applied to the result. ``np.asarray(store)`` materialises everything.

    Attributes:
        folder: the store folder.
        manifest: the parsed ``manifest.json``.
        shape: ``(N, D)``; dtype: the stored dtype.
        specs: the shard plan, in row order.
    """

    def __init__(self, folder: str | Path, manifest: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.specs = [ShardSpec.from_json(e) for e in manifest["shards"]]
        self.shape = (int(manifest["rows"]), int(manifest["dim"]))
        self.dtype = np.dtype(manifest["dtype"])
        # starts[k] is the first row of shard k; one extra entry N closes the last range.
        self._starts = np.array([s.start for s in self.specs] + [self.shape[0]], dtype=np.int64)
        self._maps: dict[int, np.ndarray] = {}

    # numpy-like facts
    ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"ShardedEmbeddings({str(self.folder)!r}, shape={self.shape}, dtype={self.dtype.name}, "
            f"shards={len(self.specs)})"
        )

    @property
    def encoder(self) -> dict[str, Any] | None:
        """The encoder config the rows were produced with (``SentenceEncoder.get_config()``), if recorded."""
        return self.manifest.get("encoder")

    def shard(self, k: int) -> np.ndarray:
        """Shard ``k`` as a read-only memory map [rows_k, D]."""
        if k not in self._maps:
            spec = self.specs[k]
            path = self.folder / SHARD_DIR / spec.name
            if spec.format == "npy":
                arr = np.load(path, mmap_mode="r")
            else:
                from ..io.arrow import read_embedding_table

                # A table is decoded into memory, not mapped: keep the last two, so a scan never holds the store.
                for old in [i for i in self._maps if self.specs[i].format != "npy"][:-1]:
                    del self._maps[old]
                arr = read_embedding_table(path, spec.format, self.shape[1], spec.start)
                arr.flags.writeable = False
            if arr.shape != (spec.rows, self.shape[1]) or arr.dtype != self.dtype:
                raise ModelFileError(f"{self.folder / SHARD_DIR / spec.name} has shape {arr.shape}, not {spec.rows}")
            self._maps[k] = arr
        return self._maps[k]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new array [stop - start, D] (a view of one memory map when in one shard)."""
        start, stop = max(0, int(start)), min(self.shape[0], int(stop))
        if stop <= start:
            return np.empty((0, self.shape[1]), dtype=self.dtype)
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        last = int(np.searchsorted(self._starts, stop - 1, side="right")) - 1
        if first == last:
            base = self.specs[first].start
            return self.shard(first)[start - base : stop - base]
        parts = []
        for k in range(first, last + 1):
            base = self.specs[k].start
            parts.append(self.shard(k)[max(start, base) - base : min(stop, self.specs[k].stop) - base])
        return np.concatenate(parts)

    def take(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """Rows at ``indices`` (any order, repeats allowed, negative counts from the end) as [len, D]."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self.shape[0]
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        idx = np.where(idx < 0, idx + n, idx)
        out = np.empty((len(idx), self.shape[1]), dtype=self.dtype)
        owner = np.searchsorted(self._starts, idx, side="right") - 1
        # One fancy index per shard, in sorted row order, so a memory map is read front to back.
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(len(self.specs) + 1))
        for k in np.unique(owner):
            sel = order[bounds[k] : bounds[k + 1]]
            local = idx[sel] - self.specs[k].start
            sort = np.argsort(local, kind="stable")
            out[sel[sort]] = self.shard(int(k))[local[sort]]
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        columns: Any = None
        if isinstance(key, tuple):
            if len(key) != 2:
                raise IndexError(f"a store is 2-D; got an index with {len(key)} parts")
            key, columns = key
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"row {key} out of range for {self.shape[0]} rows")
            k = int(np.searchsorted(self._starts, i, side="right")) - 1
            out = np.asarray(self.shard(k)[i - self.specs[k].start])
        elif isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            out = self.rows(start, stop) if step == 1 else self.take(np.arange(start, stop, step))
        else:
            arr = np.asarray(key)
            if arr.dtype == bool:
                if arr.shape != (self.shape[0],):
                    raise IndexError(f"a boolean row mask needs {self.shape[0]} entries, got {arr.shape}")
                arr = np.flatnonzero(arr)
            elif not np.issubdtype(arr.dtype, np.integer):
                raise IndexError(f"rows are indexed by integers, slices or masks, not {arr.dtype}")
            out = self.take(arr)
        return out if columns is None else out[..., columns]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # Always a fresh in-memory array: a view of a read-only memory map would surprise callers that write.
        return np.array(self.rows(0, self.shape[0]), dtype=dtype)

    def iter_chunks(self, start: int = 0, stop: int | None = None, rows: int = 65536) -> Iterator[np.ndarray]:
        """Rows ``[start, stop)`` in consecutive blocks of at most ``rows`` rows (streamed from disk)."""
        stop = self.shape[0] if stop is None else min(int(stop), self.shape[0])
        for a in range(int(start), stop, int(rows)):
            yield self.rows(a, min(a + int(rows), stop))

    def verify(self) -> None:
        """Recompute every shard's sha256 and compare it with its record.

        Raises:
            ModelFileError: naming the first shard whose bytes changed.
        """
        # A complete manifest holds its own copy of every shard's sha256 (finalize_manifest): both must agree.
        in_manifest = {int(e["index"]): e.get("sha256") for e in self.manifest.get("shards", []) if "sha256" in e}
        for spec in self.specs:
            record = _read_json(self.folder / SHARD_DIR / spec.record_name) or {}
            path = self.folder / SHARD_DIR / spec.name
            digest = sha256_file(path)
            if digest != record.get("sha256") or in_manifest.get(spec.index, digest) != digest:
                raise ModelFileError(
                    f"{path} does not match its recorded sha256: it is corrupted or was edited; re-encode the store "
                    "(distributed-encode --overwrite) or restore the shard"
                )


def open_embeddings(folder: str | Path, *, verify: bool = False) -> ShardedEmbeddings:
    """Open a store as one read-only ``[N, D]`` array in input order.

    Args:
        folder: a folder written by ``bertflow distributed-encode`` or :func:`write_store`.
        verify: also recompute every shard's sha256 (reads everything once).

    Returns:
        A :class:`ShardedEmbeddings` (``np.asarray`` of it gives a plain array; after :func:`merge_shards`,
        ``np.load(folder / "embeddings.npy", mmap_mode="r")`` gives one memory map).

    Raises:
        InputError: some shard is not complete yet (re-run the same command to finish it).
        ModelFileError: the manifest is missing, garbled or newer than this bertflow.
    """
    manifest = read_manifest(folder)
    store = ShardedEmbeddings(folder, manifest)
    missing = [s.index for s in store.specs if shard_record(folder, s, store.shape[1], store.dtype.name) is None]
    if missing:
        raise InputError(
            f"{folder}: {len(missing)} of {len(store.specs)} shard(s) are not complete ({_short(missing)}); re-run "
            "the same distributed-encode command to finish them"
        )
    if verify:
        store.verify()
    return store


def merge_shards(folder: str | Path, output: str | Path | None = None, *, rows_per_block: int = 65536) -> Path:
    """Concatenate a store's shards into one ``.npy`` (default ``OUTDIR/embeddings.npy``), streamed and atomic.

    Memory stays bounded by ``rows_per_block`` rows. The result opens as one memory map with
    ``np.load(path, mmap_mode="r")``; its sha256 is recorded in the manifest when it lies inside the store.

    Returns:
        The path of the merged file.
    """
    store = open_embeddings(folder)
    target = Path(output) if output is not None else Path(folder) / MERGED_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(store.dtype), "fortran_order": False, "shape": store.shape}
    )
    with atomic_file(target, "wb") as fh:
        blocks = (memoryview(np.ascontiguousarray(b)).cast("B") for b in store.iter_chunks(rows=rows_per_block))
        for data in itertools.chain([header.getvalue()], blocks):
            fh.write(data)
            h.update(data)
    if target.resolve().parent == Path(folder).resolve():
        manifest = read_manifest(folder)
        manifest["merged"] = {"file": target.name, "bytes": target.stat().st_size, "sha256": h.hexdigest()}
        write_manifest(folder, manifest)
    return target
