"""On-disk formats: JSON and safetensors reading and writing with clear errors, the format version, checksums.

Nothing here pickles: configs are JSON and arrays are safetensors, so a saved model can be inspected by hand
and loading one never runs code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError

__all__ = [
    "FORMAT_VERSION",
    "write_json",
    "read_json",
    "save_arrays",
    "load_arrays",
    "sha256_file",
]


#: Version of the on-disk layout. Loading refuses folders written with a larger number.
FORMAT_VERSION = 1


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
