"""Reading an embedding store back: :func:`open_embeddings` gives a :class:`ShardedEmbeddings`, one read-only
``[N, D]`` array in input order over the shards (memory-mapped, so only the rows asked for are read).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelFileError
from ..io.formats import sha256_file
from .layout import SHARD_DIR, ShardSpec, read_manifest, read_record, shard_record, short_list


class ShardedEmbeddings:
    """A read-only ``[N, D]`` view of a store's shards (``specs``, in row order) indexed like a numpy array: an
    integer, a slice (any step), an integer array or a boolean mask, and ``(rows, columns)``.

    ``.npy`` shards are memory-mapped on first use, so only the rows asked for are read (a Parquet or Arrow shard
    is read whole; at most two are kept). ``np.asarray(store)`` materialises everything.
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
        parts = []
        for k in range(first, last + 1):
            base = self.specs[k].start
            parts.append(self.shard(k)[max(start, base) - base : min(stop, self.specs[k].stop) - base])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

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
        if isinstance(key, slice):
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
            out = out if arr.ndim else out[0]  # an integer: one row [D]
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
        """Recompute every shard's sha256 against its record; ModelFileError naming the first that changed."""
        # A complete manifest holds its own copy of every shard's sha256 (finalize_manifest): both must agree.
        in_manifest = {int(e["index"]): e.get("sha256") for e in self.manifest.get("shards", []) if "sha256" in e}
        for spec in self.specs:
            record = read_record(self.folder / SHARD_DIR / spec.record_name) or {}
            path = self.folder / SHARD_DIR / spec.name
            digest = sha256_file(path)
            if digest != record.get("sha256") or in_manifest.get(spec.index, digest) != digest:
                raise ModelFileError(
                    f"{path} does not match its recorded sha256: it is corrupted or was edited; re-encode the store "
                    "(distributed-encode --overwrite) or restore the shard"
                )


def open_embeddings(folder: str | Path, *, verify: bool = False) -> ShardedEmbeddings:
    """Open a store (``bertflow distributed-encode``, :func:`write_store`) as a :class:`ShardedEmbeddings`;
    ``verify`` also recomputes every shard's sha256 (reads everything once). InputError while some shard is not
    complete (re-run the same command); ModelFileError for a missing, garbled or newer manifest."""
    manifest = read_manifest(folder)
    store = ShardedEmbeddings(folder, manifest)
    missing = [s.index for s in store.specs if shard_record(folder, s, store.shape[1], store.dtype.name) is None]
    if missing:
        raise InputError(
            f"{folder}: {len(missing)} of {len(store.specs)} shard(s) are not complete ({short_list(missing)}); re-run "
            "the same distributed-encode command to finish them"
        )
    if verify:
        store.verify()
    return store
