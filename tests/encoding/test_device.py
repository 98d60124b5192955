"""Device and dtype names (bertflow.encoding.device)."""

from __future__ import annotations

import pytest

from bertflow import InputError
from bertflow.encoding.device import resolve_device, resolve_dtype


def test_device_and_dtype_names():
    import torch

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(InputError, match="unknown dtype 'float8'"):
        resolve_dtype("float8", torch.device("cpu"))
    with pytest.raises(InputError, match="unknown device"):
        resolve_device("tpu:x:y")
