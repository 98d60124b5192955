"""Where and in which precision the encoder runs: device and dtype names, SDPA attention backends."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..errors import InputError


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The torch device for ``device`` (``None``: CUDA when available, else CPU), checked before any model loads:
    an InputError for an unknown name or a CUDA/MPS device this machine does not have."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"unknown device {str(device)!r}; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {str(device)!r} asked for, but CUDA is not available here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(
                f"device {str(device)!r} asked for, but this machine has {torch.cuda.device_count()} GPU(s)"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {str(device)!r} asked for, but MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"device {str(device)!r} is not supported; use cpu, cuda, cuda:N or mps")
    return dev


#: The dtype names :func:`resolve_dtype` accepts besides ``auto`` (torch's names), and their short spellings.
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The torch dtype for ``dtype`` (``"auto"``: bfloat16 on CUDA, float32 elsewhere); an InputError for an
    unknown name."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name not in DTYPE_NAMES:
        raise InputError(f"unknown dtype {dtype!r}: use auto, {', '.join(DTYPE_NAMES[:-1])} or {DTYPE_NAMES[-1]}")
    return getattr(torch, name)


def attention_backends(device: torch.device, cudnn: bool = False) -> contextlib.AbstractContextManager[Any]:
    """SDPA kernels for our forward passes: on CUDA, flash / memory-efficient / math, not cuDNN (unless ``cudnn``).

    On Hopper and newer with a recent cuDNN, torch tries cuDNN attention first, and cuDNN builds an
    execution plan for every new (batch, length) shape: tens of milliseconds each, while token-budget
    batches have a new shape almost every time. The choice is restored when the forward returns (torch
    keeps it in process-wide flags, so another thread's attention call at that moment sees it too).
    """
    if device.type != "cuda" or cudnn:
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: no cuDNN attention to avoid either
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def transformers_major() -> int:
    """The installed transformers major version."""
    import transformers

    return int(transformers.__version__.split(".")[0])
