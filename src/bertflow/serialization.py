"""Files on disk: atomic file and folder writes, JSON and safetensors reading with clear errors, checksums.

Nothing here pickles: configs are JSON and arrays are safetensors, so a saved model can be inspected by hand
and loading one never runs code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from .errors import ModelFileError

__all__ = [
    "FORMAT_VERSION",
    "TMP_MARK",
    "atomic_directory",
    "atomic_file",
    "atomic_write_text",
    "apply_umask",
    "current_umask",
    "fsync_dir",
    "temporary_name",
    "write_json",
    "read_json",
    "save_arrays",
    "load_arrays",
    "sha256_file",
]

#: Version of the on-disk layout. Loading refuses folders written with a larger number.
FORMAT_VERSION = 1


#: Marks the name of a file being written (``.NAME.tmp-HOST-PID``): a stale one, left by a killed writer, is found
#: by it and removed by the code that owns the folder.
TMP_MARK = ".tmp-"


def temporary_name(path: Path) -> Path:
    """A hidden name beside ``path`` to write it under before the rename. Host and pid are part of it, so writers
    on several nodes sharing a folder never collide and a stale file says who left it."""
    return path.with_name(f".{path.name}{TMP_MARK}{socket.gethostname()}-{os.getpid()}")


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing (``mode`` and ``kwargs`` as for :func:`open`).

    When the block ends normally the file is flushed, fsynced and renamed over ``path``: readers see the old file
    or the whole new one, never a part. On any exception it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8, atomically (see :func:`atomic_file`)."""
    with atomic_file(path, "w", encoding="utf-8") as fh:
        fh.write(text)


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success it replaces ``target`` in one rename.

    A crash or exception inside the block leaves ``target`` exactly as it was (old model or nothing),
    never half-written. An existing ``target`` is moved aside first and deleted only after the swap.
    """
    target = Path(target).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not target.is_dir():
        raise ModelFileError(f"{target} exists and is not a folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{TMP_MARK}", dir=target.parent))
    try:
        yield tmp
        apply_umask(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        backup = None
        if target.exists():
            backup = target.parent / f".{target.name}.old-{os.getpid()}"
            os.replace(target, backup)
        os.replace(tmp, target)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def current_umask() -> int:
    """The process's file-mode creation mask, read without changing it where possible (Linux: /proc/self/status;
    ``os.umask`` must set a value to read one, which would briefly apply to files other threads create)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes a plain ``mkdir`` / ``open`` would: 0777 (folders) or 0666
    (files) less the umask, so 0755 / 0644 under the usual 022.

    ``tempfile.mkdtemp`` creates its folder 0700, and copied files keep their source's mode (a read-only or
    private cache), so without this a saved model could not be read by the other users who share it.
    """
    mask = current_umask()
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented, key-sorted UTF-8 JSON (diff-friendly)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, turning every failure into a :class:`ModelFileError` naming the file."""
    if not path.is_file():
        raise ModelFileError(f"missing file {path}: the model folder is incomplete")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path} is not valid JSON ({e}); the file is corrupted or was edited") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Save named numpy arrays as safetensors (contiguous copies; safetensors refuses views)."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Load a safetensors file, turning truncation or corruption into a :class:`ModelFileError`."""
    from safetensors.numpy import load_file

    if not path.is_file():
        raise ModelFileError(f"missing file {path}: the model folder is incomplete")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for every kind of damage
        raise ModelFileError(f"{path} is truncated or corrupted and cannot be read ({e})") from None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
