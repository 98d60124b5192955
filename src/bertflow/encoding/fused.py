"""Fused steps of the unpadded BERT layer (issue 23): residual add + LayerNorm in one pass, QKV in one GEMM.

On STS text the unpadded forward of BERT-base spends about a quarter of its device time outside the matmuls, in
memory-bound steps over the whole ``[total_tokens, hidden]`` activation (docs/performance.md, third round):
:func:`add_layer_norm` reads each input once (Triton; float32 statistics, so it rounds once where the modules round
twice), :func:`qkv_weights` makes one GEMM of width 3H out of three, :func:`linear_gelu` puts the tanh GELU (within
5e-4 of the exact one) in the GEMM's epilogue. Plain torch where Triton or CUDA is missing (CPU tests compare).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

_KERNEL: Any = None


def triton_available(device: torch.device) -> bool:
    """Whether :func:`add_layer_norm` runs its Triton kernel here (CUDA and an importable Triton)."""
    return device.type == "cuda" and _triton_importable()


@functools.cache
def _triton_importable() -> bool:
    """Whether CUDA is usable and Triton imports (asked once: :func:`add_layer_norm` runs twice a layer)."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _kernel() -> Any:
    """The Triton kernel, defined on first use (Triton is imported only on a CUDA machine)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["m"])  # the row count changes every batch: one compiled kernel for all
    def add_ln(y_ptr, r_ptr, w_ptr, b_ptr, o_ptr, m, n, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        cmask = cols < n
        mask = (rows < m)[:, None] & cmask[None, :]
        offs = rows.to(tl.int64)[:, None] * n + cols[None, :]
        x = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x += tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n
        d = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / n + eps)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        out = d * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(o_ptr + offs, out.to(o_ptr.dtype.element_ty), mask=mask)

    _KERNEL = (add_ln, triton)
    return _KERNEL


def add_layer_norm(y: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """``norm(y + residual)`` ([T, H] in ``y``'s dtype; ``norm`` the layer's ``LayerNorm`` over H) in one pass on
    CUDA (Triton), else by the modules' torch ops."""
    if not triton_available(y.device) or norm.weight is None or norm.bias is None:
        return norm(y + residual)
    m, n = y.shape
    y, residual = y.contiguous(), residual.contiguous()
    out = torch.empty_like(y)
    kernel, triton = _kernel()
    block = triton.next_power_of_2(n)
    rows = max(1, min(16, 4096 // block))
    kernel[(triton.cdiv(m, rows),)](
        y, residual, norm.weight, norm.bias, out, m, n, float(norm.eps), ROWS=rows, BLOCK=block, num_warps=4
    )
    return out


def qkv_weights(attention: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``BertSelfAttention``'s query, key and value projections as one ([3H, H] weight, [3H] bias): a copy."""
    parts = (attention.query, attention.key, attention.value)
    return torch.cat([p.weight for p in parts]).contiguous(), torch.cat([p.bias for p in parts]).contiguous()


def linear_gelu(x: torch.Tensor, dense: torch.nn.Linear) -> torch.Tensor:
    """``gelu_tanh(dense(x))``, x [T, H] -> [T, I]: on CUDA with the GELU in the GEMM's epilogue (cuBLASLt's GELU is
    the tanh form; torch's CPU version of the same call uses the exact one, so elsewhere it is spelled out)."""
    if x.device.type == "cuda":
        return torch._addmm_activation(dense.bias, x, dense.weight.t(), use_gelu=True)
    return F.gelu(dense(x), approximate="tanh")
