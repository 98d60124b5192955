"""Writing one shard of an embedding store, ``.npy`` (:class:`ShardWriter`) or Parquet/Arrow
(:class:`TableShardWriter`): under a temporary name, fsynced and renamed, and only then its completion record, so a
killed writer never leaves a short shard."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..io.files import atomic_file, atomic_write_text
from ..io.formats import json_text
from .layout import SHARD_DIR, ShardSpec


class ShardWriter:
    """Write shard ``spec`` of the store ``folder``: a ``.npy`` header, the float32 [n, ``dim``] rows as they come, then
    fsync, rename (:func:`~bertflow.io.files.atomic_file`) and the completion record (with ``record``'s fields).

    Rows are written and hashed by a ``background`` thread, overlapping the encoding of the next rows. Nothing
    under the final names exists until :meth:`commit` returns; an exception in the ``with`` block deletes the
    temporary file."""

    def __init__(
        self,
        folder: str | Path,
        spec: ShardSpec,
        dim: int,
        *,
        record: dict[str, Any] | None = None,
        background: bool = True,
    ) -> None:
        self.spec = spec
        self.dim = int(dim)
        self.dtype = np.dtype(np.float32)
        self.extra = dict(record or {})
        self.shard_dir = Path(folder) / SHARD_DIR
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.shard_dir / spec.name
        self._written = 0  # rows handed to write()
        self._started = time.perf_counter()
        self._stack = contextlib.ExitStack()
        self._fh = self._stack.enter_context(atomic_file(self.path, "wb"))
        self._begin()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shard-writer") if background else None
        self._pending: list[concurrent.futures.Future[None]] = []
        self._done = False

    # The file's content (an .npy here; TableShardWriter overrides these for Parquet/Arrow), under atomic_file.

    def _begin(self) -> None:
        self._hash = hashlib.sha256()  # of the whole file, header included
        header = io.BytesIO()
        descr, shape = np.lib.format.dtype_to_descr(self.dtype), (self.spec.rows, self.dim)
        np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
        self._write_block(np.frombuffer(header.getvalue(), dtype=np.uint8))

    def _write_block(self, block: np.ndarray) -> None:
        data = memoryview(block).cast("B")
        self._fh.write(data)
        self._hash.update(data)

    def _digest(self) -> str:
        """The sha256 of the whole file, once every row is written."""
        return self._hash.hexdigest()

    def _discard(self) -> None:
        self._stack.__exit__(RuntimeError, RuntimeError("shard aborted"), None)  # atomic_file deletes the file

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
        """Finish the shard: wait for the writes, fsync, rename, write the record; return it. On failure (InputError
        if short) the shard is aborted."""
        if self._done:
            raise RuntimeError("this shard was already committed or aborted")
        try:
            for future in self._pending:
                future.result()
            self._pending.clear()
            if self._written != self.spec.rows:
                raise InputError(f"shard {self.spec.index} got {self._written} rows, expected {self.spec.rows}")
            self._shutdown()
            digest = self._digest()
            size = self._fh.tell()
            self._stack.close()  # flush, fsync and rename the file to its final name
        except BaseException:
            self.abort()
            raise
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
        atomic_write_text(self.shard_dir / self.spec.record_name, json_text(record))
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
    """A :class:`ShardWriter` for a Parquet or Arrow IPC float32 shard (:class:`bertflow.io.arrow.EmbeddingTableWriter`,
    one row group or record batch per :meth:`write`), with ``ids = (name, pyarrow array of the shard's rows)``
    copied beside the embeddings."""

    def __init__(
        self, folder: str | Path, spec: ShardSpec, dim: int, *, ids: tuple[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if ids is not None and len(ids[1]) != spec.rows:
            raise InputError(f"shard {spec.index} holds {spec.rows} rows but got {len(ids[1])} ids")
        self._ids = ids
        super().__init__(folder, spec, dim, **kwargs)

    def _begin(self) -> None:
        from ..io.arrow import EmbeddingTableWriter, pyarrow

        id_field = pyarrow().field(self._ids[0], self._ids[1].type) if self._ids is not None else None
        self._table = EmbeddingTableWriter(self._fh, self.spec.format, self.dim, id_field)
        self._row = self.spec.start

    def _write_block(self, block: np.ndarray) -> None:
        local = self._row - self.spec.start
        ids = self._ids[1].slice(local, len(block)) if self._ids is not None else None
        self._table.write(self._row, block, ids)
        self._row += len(block)

    def _digest(self) -> str:
        return self._table.close()  # writes the footer

    def _discard(self) -> None:
        # Close the table writer while its file is open (pyarrow would write to a closed file when it is collected).
        with contextlib.suppress(Exception):
            self._table.close()
        super()._discard()


def open_shard_writer(
    folder: str | Path,
    spec: ShardSpec,
    dim: int,
    *,
    record: dict[str, Any] | None = None,
    ids: tuple[str, Any] | None = None,
) -> ShardWriter:
    """The writer of shard ``spec`` in its format: a :class:`ShardWriter` (``.npy``, no ``ids``) or a
    :class:`TableShardWriter`."""
    if spec.format == "npy":
        return ShardWriter(folder, spec, dim, record=record)
    return TableShardWriter(folder, spec, dim, record=record, ids=ids)
