"""Embedding stores: a folder of shards (``shards/part-NNNNNN.npy`` or Parquet/Arrow tables, each with a
completion record ``part-NNNNNN.json``) and ``manifest.json``, read back as one array in input order. ``layout``
holds names, manifest, plan and completion, ``shards`` the writers, ``reader`` :func:`open_embeddings`; this module
:func:`write_store` and :func:`merge_shards`.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..io.files import atomic_file
from .layout import (
    DEFAULT_SHARD_SIZE,
    MANIFEST_NAME,
    MERGED_NAME,
    finalize_manifest,
    new_manifest,
    plan_shards,
    read_manifest,
    write_manifest,
)
from .reader import ShardedEmbeddings, open_embeddings
from .shards import ShardWriter


def write_store(
    X: np.ndarray,
    folder: str | Path,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    info: dict[str, Any] | None = None,
) -> ShardedEmbeddings:
    """Save an in-memory matrix [N, D] (stored float32) as a store in ``folder`` (which may not hold one), with
    ``info`` in the manifest (``encoder``, ``input``...); returns it opened."""
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


def merge_shards(folder: str | Path, output: str | Path | None = None, *, rows_per_block: int = 65536) -> Path:
    """Concatenate a store's shards into one ``.npy`` (default ``OUTDIR/embeddings.npy``, its sha256 then recorded
    in the manifest), streamed ``rows_per_block`` rows at a time and atomic; returns its path."""
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
