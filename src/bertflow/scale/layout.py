"""The layout of an embedding store on disk (:mod:`bertflow.scale.store`): file names, the manifest, the shard plan
(which rows each shard holds) and shard completion."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import InputError, ModelFileError
from ..io.files import FOLDER_KINDS, TMP_MARK, atomic_write_text
from ..io.formats import check_format, json_text

MANIFEST_NAME = FOLDER_KINDS["store"][0]  # "manifest.json"
SHARD_DIR = "shards"
MERGED_NAME = "embeddings.npy"
STORE_FORMAT = FOLDER_KINDS["store"][2]  # "bertflow-embeddings"
#: Version of the store layout; reading refuses a larger number. 1: ``.npy`` shards; 2: Parquet/Arrow shards too.
STORE_FORMAT_VERSION = 2
#: Shard file formats and their suffixes (``npy`` is the default and memory-maps; the others are for other tools).
SHARD_SUFFIXES = {"npy": ".npy", "parquet": ".parquet", "arrow": ".arrow"}
#: Rows per shard unless asked otherwise: two chunks of the default 16,384. Shards are the unit a rank takes, so
#: their size bounds the imbalance between ranks and what a killed rank loses; smaller ones cost only their commits.
DEFAULT_SHARD_SIZE = 32768


def read_record(path: Path) -> dict[str, Any] | None:
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
    atomic_write_text(folder / MANIFEST_NAME, json_text(manifest))


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """A store's ``manifest.json``; ModelFileError if missing, garbled, not a store's, or of a newer format."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise ModelFileError(f"{path} is missing: {folder} is not a bertflow embedding store (or was never started)")
    data = read_record(path)
    if data is None:
        raise ModelFileError(f"{path} is not valid JSON; the file is corrupted or was edited")
    if data.get("format") != STORE_FORMAT:
        raise ModelFileError(f"{path} is not a bertflow embedding-store manifest")
    check_format(data, path, kind="embedding store", current=STORE_FORMAT_VERSION)
    for key in ("rows", "dim", "dtype", "shards"):
        if key not in data:
            raise ModelFileError(f"{path} lacks {key!r}; was it edited?")
    return data


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` of the plan (file ``shards/part-{index:06d}{suffix}``): input rows ``[start, stop)``, row
    ``start`` beginning at byte ``offset`` of a text input (else 0)."""

    index: int
    start: int
    stop: int
    offset: int = 0
    suffix: str = ".npy"

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def name(self) -> str:
        return f"part-{self.index:06d}{self.suffix}"

    @property
    def format(self) -> str:
        return self.suffix.lstrip(".")

    @property
    def record_name(self) -> str:
        """The shard's completion record, ``part-{index:06d}.json``."""
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


def check_store_options(
    *,
    shard_size: int,
    chunk_size: int,
    batch_size: int | None,
    encoding_errors: str,
    shard_format: str,
    id_column: str | None,
) -> None:
    """Refuse (InputError) store options that cannot work, before any work: sizes below 1, a ``shard_size`` that is
    not a multiple of ``chunk_size``, an unknown ``encoding_errors``, an ``id_column`` with ``.npy`` shards."""
    if shard_size < 1 or chunk_size < 1 or (batch_size is not None and batch_size < 1):
        raise InputError("shard_size, chunk_size and batch_size must be positive")
    if shard_size % chunk_size:
        raise InputError(
            f"shard_size ({shard_size}) must be a multiple of chunk_size ({chunk_size}), so that every shard is made "
            "of whole encoder chunks and the output does not depend on how the input was split"
        )
    if encoding_errors not in ("strict", "replace"):
        raise InputError(f"encoding_errors must be 'strict' or 'replace', got {encoding_errors!r}")
    if id_column is not None and shard_format == "npy":
        raise InputError("--id-column needs table shards (--format parquet or arrow): .npy shards hold only vectors")


def plan_shards(
    n_rows: int, shard_size: int, offsets: Sequence[int] | None = None, *, shard_format: str = "npy"
) -> list[ShardSpec]:
    """Cut ``n_rows`` rows into shards of ``shard_size`` rows (the last one shorter), with every shard's first
    line's byte ``offsets`` if from a text file, in ``shard_format`` (:data:`SHARD_SUFFIXES`)."""
    if shard_size < 1:
        raise InputError(f"shard_size must be positive, got {shard_size}")
    if shard_format not in SHARD_SUFFIXES:
        raise InputError(f"the shard format must be one of {', '.join(SHARD_SUFFIXES)}, got {shard_format!r}")
    size, suffix = shard_size, SHARD_SUFFIXES[shard_format]
    return [
        ShardSpec(k, k * size, min(k * size + size, n_rows), int(offsets[k]) if offsets is not None else 0, suffix)
        for k in range(-(-n_rows // size))
    ]


def shard_record(folder: str | Path, spec: ShardSpec, dim: int, dtype: str = "float32") -> dict[str, Any] | None:
    """The completion record of shard ``spec`` if the shard is complete and matches the plan, else ``None``:
    the record names the same rows, dim and dtype, the file has the recorded size and a header (table metadata) of
    ``[rows, dim]``. The checksum is not recomputed (:meth:`ShardedEmbeddings.verify` does)."""
    shard_dir = Path(folder) / SHARD_DIR
    record = read_record(shard_dir / spec.record_name)
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
        with open(path, "rb") as fh:  # a version 1.0 header, as ShardWriter writes
            np.lib.format.read_magic(fh)
            shape, _, file_dtype = np.lib.format.read_array_header_1_0(fh)
    except (OSError, ValueError):
        return None
    if tuple(shape) != (spec.rows, dim) or file_dtype != np.dtype(dtype):
        return None
    return record


def remove_temporary_files(folder: str | Path) -> int:
    """Delete the temporary files killed writers left in a store (under its lock); returns how many."""
    pattern = f".*{TMP_MARK}*"
    found = [f for f in [*Path(folder).glob(pattern), *(Path(folder) / SHARD_DIR).glob(pattern)] if f.is_file()]
    for f in found:
        f.unlink(missing_ok=True)
    return len(found)


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
    """Mark a store complete: every shard's record (bytes, sha256) into the manifest, ``run`` appended to ``runs``;
    InputError listing the shards that are not complete."""
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
        raise InputError(f"{folder}: {len(missing)} of {len(specs)} shard(s) are not complete: {short_list(missing)}")
    manifest["shards"] = entries
    manifest["complete"] = True
    if run is not None:
        manifest.setdefault("runs", []).append(run)
    write_manifest(folder, manifest)
    return manifest


def short_list(items: Sequence[int], limit: int = 12) -> str:
    """The first ``limit`` items, comma-separated, and how many there are in all when some were left out."""
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" ... ({len(items)} in all)" if len(items) > limit else "")
