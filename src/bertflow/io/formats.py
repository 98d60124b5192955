"""On-disk formats: JSON and safetensors reading and writing with clear errors, the format version, checksums.

Nothing here pickles: configs are JSON and arrays are safetensors, so a saved model can be inspected by hand
and loading one never runs code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import ModelFileError

#: Version of the on-disk layout. Loading refuses folders written with a larger number.
FORMAT_VERSION = 1


def check_format(config: dict[str, Any], path: str | Path, *, kind: str, current: int = FORMAT_VERSION) -> int:
    """The ``format_version`` of a saved ``config`` read from ``path`` (a ``kind`` of file: ``"model"``,
    ``"search index"``...), the one check of every loader. ModelFileError without an integer version (edited) or
    one above ``current`` (upgrade bertflow)."""
    version = config.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ModelFileError(f"{path} has no valid format_version ({version!r}); was it edited?")
    if version > current:
        written = config.get("bertflow_version")
        raise ModelFileError(
            f"{path} is a {kind} written by bertflow {written or '(version not recorded)'} in format {version}; this "
            f"is bertflow {__version__}, which reads {kind} formats up to {current}: upgrade bertflow to load it "
            "(unless the file was edited)"
        )
    return version


def json_text(data: dict[str, Any]) -> str:
    """``data`` as the text of every JSON file bertflow writes: indented, key-sorted UTF-8 (diff-friendly)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as :func:`json_text`."""
    path.write_text(json_text(data), encoding="utf-8")


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
    """Save named numpy arrays as safetensors. The bytes are written here (one in-memory copy), so a failing write
    is the ``OSError`` every writer reports, not safetensors' own error (or, on some devices, none)."""
    from safetensors.numpy import save

    data = save({k: np.ascontiguousarray(v) for k, v in arrays.items()})
    with open(path, "wb") as fh:
        fh.write(data)


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


def path_inside(folder: Path, rel: object, *, config: Path, what: str) -> Path:
    """``folder / rel`` for a relative path read from the saved ``config`` (entry ``what``); ModelFileError for an
    empty, absolute or ``..`` path. Checked on the text: a hub snapshot's files are links into its blob cache."""
    text = str(rel) if isinstance(rel, str) else ""
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if not text or PurePosixPath(text).is_absolute() or PureWindowsPath(text).drive or ".." in parts:
        raise ModelFileError(f"{config}: {what} is {rel!r}, which is not a path inside the folder; was it edited?")
    return folder.joinpath(*parts)


def verify_checksums(folder: Path, files: object, read_dirs: list[Path], *, config: Path) -> None:
    """Check a saved folder against the checksums its ``config`` lists (``files``: {relative path: hex sha256}):
    every listed file must match and every file under ``read_dirs`` be listed; else ModelFileError naming it."""
    if not isinstance(files, dict) or not files:
        raise ModelFileError(
            f"{config} has no 'files' checksums (removed or garbled), so the folder cannot be checked; "
            "was it edited? Save it again"
        )
    for rel, digest in files.items():
        file = path_inside(folder, rel, config=config, what=f"files entry {rel!r}")
        if not file.is_file():
            raise ModelFileError(f"{file} is missing: the folder is incomplete")
        if sha256_file(file) != digest:
            raise ModelFileError(f"{file} does not match its checksum: it is truncated, corrupted or edited")
    listed = {folder.joinpath(*PurePosixPath(rel).parts) for rel in files}
    for directory in read_dirs:
        if not directory.is_dir():
            raise ModelFileError(f"{directory} is missing: the folder is incomplete")
        for file in sorted(directory.rglob("*")):
            if file.is_file() and file not in listed:
                raise ModelFileError(f"{file} has no checksum in {config}: it was added or the config was edited")
