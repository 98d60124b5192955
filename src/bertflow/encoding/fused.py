"""Fused steps of the unpadded BERT layer (issue 23): residual add + LayerNorm in one pass, QKV in one GEMM.

On STS text the unpadded forward of BERT-base spends about a quarter of its device time outside the matmuls, in
memory-bound steps over the whole ``[total_tokens, hidden]`` activation (docs/performance.md, third round):
:func:`add_layer_norm` reads each input once (Triton; float32 statistics, so it rounds once where the modules round
twice), :func:`qkv_weights` makes one GEMM of width 3H out of three, :func:`linear_gelu` puts the tanh GELU (within
5e-4 of the exact one) in the GEMM's epilogue, and :func:`segment_attention` runs attention on the packed tokens
without padding or a mask tensor. Plain torch where Triton or CUDA is missing (CPU tests compare).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


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


@functools.cache  # asked at every launch: three times a layer
def _kernels() -> Any:
    """The module of Triton kernels (:mod:`bertflow.encoding.triton_kernels`), imported on first use: Triton is
    imported only where a kernel runs."""
    from . import triton_kernels

    return triton_kernels


def add_layer_norm(y: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """``norm(y + residual)`` ([T, H] in ``y``'s dtype; ``norm`` the layer's ``LayerNorm`` over H) in one pass on
    CUDA (Triton), else by the modules' torch ops."""
    if not triton_available(y.device) or norm.weight is None or norm.bias is None:
        return norm(y + residual)
    m, n = y.shape
    y, residual = y.contiguous(), residual.contiguous()
    out = torch.empty_like(y)
    block = 1 << (n - 1).bit_length()  # the next power of two
    rows = max(1, min(16, 4096 // block))
    _kernels().add_ln[(-(-m // rows),)](
        y, residual, norm.weight, norm.bias, out, m, n, float(norm.eps), ROWS=rows, BLOCK=block, num_warps=4
    )
    return out


#: Largest tile of :func:`segment_attention`, so the longest sentence it takes (a tile's [block, block] scores stay
#: in registers).
TILE_MAX = 128


def attention_kernel_fits(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the attention kernel (:func:`segment_attention`) runs for a model's heads of ``head_dim`` in
    ``dtype`` on ``device``: CUDA with Triton, half precision, head_dim a power of two 16-128."""
    return (
        triton_available(device)
        and dtype in (torch.float16, torch.bfloat16)
        and 16 <= head_dim <= 128
        and head_dim & (head_dim - 1) == 0
    )


def segment_attention_fits(q: torch.Tensor, width: int) -> bool:
    """Whether :func:`segment_attention` runs its kernel for ``q`` [tokens, heads, head_dim] and sentences of at
    most ``width`` tokens: :func:`attention_kernel_fits`, ``width`` <= :data:`TILE_MAX` and the last dimension
    contiguous."""
    return attention_kernel_fits(q.device, q.dtype, q.shape[-1]) and width <= TILE_MAX and q.stride(-1) == 1


def _compiled(q: torch.Tensor) -> None:
    """Compile (or load) the attention kernel at every tile size for ``q``'s device, dtype, shape and strides, once
    per process: Triton compiles a kernel the first time it meets a tile size (about 0.5 s each on an H200 host,
    then cached on disk, a few ms to load), which would otherwise fall in the middle of a later pass."""
    key = (q.device, q.dtype, q.shape[1:], q.stride())
    if key in _READY:
        return
    _, heads, d = q.shape
    scratch = torch.empty_strided((1, heads, d), q.stride(), dtype=q.dtype, device=q.device).zero_()
    cu = torch.tensor([0, 1], dtype=torch.int32, device=q.device)
    zero = torch.zeros(1, dtype=torch.int64, device=q.device)
    _READY.add(key)  # before the calls below, which come back here
    for tile in (16, 32, 64, TILE_MAX):
        segment_attention(scratch, scratch, scratch, cu, zero, ((tile, 0, 1, 1),))


#: The (device, dtype, [heads, head_dim], strides) whose kernels are compiled or loaded in this process.
_READY: set[tuple[Any, ...]] = set()


#: One launch of :func:`segment_attention`: ``(block, first, last, per)``, sentences ``first .. last - 1`` in
#: programs of ``per`` consecutive sentences, each program a ``block``-token tile.
Tile = tuple[int, int, int, int]

#: Most launches per layer :func:`segment_tiles` makes before it falls back to one launch for the whole batch.
MAX_TILE_RUNS = 8


def tile_runs(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For sentences of ``lengths`` tokens (int [n], host, each 1-128): ``(block, per, starts, stops)``, each
    sentence's tile (the smallest power of two from 16 that holds it) and how many such sentences fit in it (a power
    of two), both int64 [n], and the runs of consecutive sentences with the same two, ``starts[i] .. stops[i] - 1``.
    The attention kernels give each run its tile (:func:`segment_tiles`,
    :func:`~bertflow.encoding.graphs.attention_runs`)."""
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    block = np.maximum(16, 1 << np.ceil(np.log2(lengths)).astype(np.int64))
    per = 1 << np.floor(np.log2(block // lengths)).astype(np.int64)
    cuts = np.flatnonzero(np.diff(block * (TILE_MAX + 1) + per)) + 1
    return block, per, np.concatenate([[0], cuts]), np.concatenate([cuts, [len(lengths)]])


def segment_tiles(lengths: np.ndarray) -> tuple[Tile, ...]:
    """The launches of :func:`segment_attention` for sentences of ``lengths`` tokens (int [rows], host, each
    1-128), in order: consecutive sentences that take the same tile and fit the same number of times in it share a
    launch (:func:`tile_runs`). Batches come sorted by length, so that is a few launches; in any other order, more
    than :data:`MAX_TILE_RUNS` become one launch with the largest tile."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return ()
    block, per, starts, stops = tile_runs(lengths)
    if len(starts) > MAX_TILE_RUNS:
        top = int(block.max())
        return ((top, 0, len(lengths), int(1 << int(np.log2(top // int(lengths.max()))))),)
    return tuple((int(block[a]), int(a), int(b), int(per[a])) for a, b in zip(starts, stops, strict=True))


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    positions: torch.Tensor,
    tiles: tuple[Tile, ...],
) -> torch.Tensor:
    """Attention within each sentence of packed tokens, no padding anywhere (CUDA, Triton;
    :func:`segment_attention_fits` says when, ``width`` the longest sentence).

    ``q``, ``k``, ``v`` [total, heads, head_dim] (views of one QKV GEMM's output are taken as they are): sentence
    ``j``'s tokens are ``cu_seqlens[j] .. cu_seqlens[j + 1] - 1`` (int32 [rows + 1]); ``positions`` int [total],
    each token's position in its sentence; ``tiles``: :func:`segment_tiles` of the sentences' lengths. Returns
    [total, heads, head_dim] contiguous: softmax(q k^T / sqrt(head_dim)) v over the query's sentence.
    """
    total, heads, d = q.shape
    q, k, v = _one_stride(q, k, v)
    _compiled(q)
    out = torch.empty((total, heads, d), dtype=q.dtype, device=q.device)
    kernel = _kernels().segment_attn
    for block, first, last, per in tiles:
        _launch(
            kernel,
            (-(-(last - first) // per), heads),
            q,
            k,
            v,
            (cu_seqlens, positions, out, first, last, per),
            out,
            block,
        )
    return out


def _one_stride(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q``, ``k``, ``v`` as the attention kernels take them: with one set of strides for the three (views of one
    QKV GEMM's output as they are, else contiguous copies)."""
    if q.stride() == k.stride() == v.stride():
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


def _launch(
    kernel: Any,
    grid: tuple[int, int],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    args: tuple[Any, ...],
    out: torch.Tensor,
    block: int,
) -> None:
    """One launch of an attention kernel of :mod:`~bertflow.encoding.triton_kernels` on ``grid``: ``q, k, v``, the
    kernel's own ``args`` (``out`` among them), then what its tile (``attend_tile``) takes: the scale, the strides of
    ``q`` (shared by ``k`` and ``v``) and ``out``, a ``block``-token tile of the heads' width."""
    d = q.shape[-1]
    kernel[grid](
        q,
        k,
        v,
        *args,
        d**-0.5,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK=block,
        D=d,
        num_warps=min(8, block // 16),
    )


#: The tiles of :func:`grouped_attention`, one launch each: a run of sentences takes the smallest that holds its
#: longest, as in :func:`segment_tiles`.
GROUP_BLOCKS = (16, 32, 64, TILE_MAX)
#: Programs of :func:`grouped_attention` per launch, over all heads (each loops over its class's runs): about as
#: many one-warp programs as an H100 keeps resident at once.
GROUP_PROGRAMS = 4096


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    groups: torch.Tensor,
    bounds: torch.Tensor,
) -> torch.Tensor:
    """:func:`segment_attention` with launches that do not depend on the batch, so that a CUDA graph replays them
    for any batch of its shape (:mod:`bertflow.encoding.graphs`); plain torch where the kernel does not run.

    ``q``, ``k``, ``v`` [total, heads, head_dim]; ``positions`` int [total], each token's position in its sentence;
    ``groups`` int32 [G, 2], token ranges ``(first, end)`` of runs of consecutive sentences, each at most its class's
    tile of :data:`GROUP_BLOCKS`; ``bounds`` int32 [len(GROUP_BLOCKS) + 1], class ``c``'s runs being rows
    ``bounds[c] .. bounds[c + 1] - 1`` of ``groups`` (both on the device). Returns [total, heads, head_dim], 0 at
    tokens of no run (a shape's padding).
    """
    total, heads, d = q.shape
    if not segment_attention_fits(q, TILE_MAX):
        return _grouped_attention_reference(q, k, v, positions, groups, bounds)
    q, k, v = _one_stride(q, k, v)
    out = torch.zeros((total, heads, d), dtype=q.dtype, device=q.device)
    kernel = _kernels().group_attn
    programs = max(1, GROUP_PROGRAMS // heads)
    for c, block in enumerate(GROUP_BLOCKS):
        _launch(kernel, (programs, heads), q, k, v, (positions, out, groups, bounds, c), out, block)
    return out


def _grouped_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    groups: torch.Tensor,
    bounds: torch.Tensor,
) -> torch.Tensor:
    """:func:`grouped_attention` by SDPA, one run at a time (reads the tables on the host: tests, CPU)."""
    out = torch.zeros_like(q)
    lo, hi = int(bounds[0]), int(bounds[-1])
    for t0, t1 in groups[lo:hi].tolist():
        start = torch.arange(t0, t1, device=q.device) - positions[t0:t1]
        mask = start[:, None] == start[None, :]
        rows = (t.transpose(0, 1) for t in (q[t0:t1], k[t0:t1], v[t0:t1]))
        out[t0:t1] = F.scaled_dot_product_attention(*rows, attn_mask=mask).transpose(0, 1)
    return out


def segment_mean(x: torch.Tensor, cu_seqlens: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [R, D]: the mean of each sentence's rows of ``x`` [T, D] (sentence ``r``: rows ``cu_seqlens[r] ..
    cu_seqlens[r + 1] - 1``, int32 [R + 1] on ``x``'s device), weighted by positive ``weights`` [T] if given
    (``sum w x / sum w``); 0 for a sentence of no rows. Tokens are summed in a fixed order (Triton on CUDA, torch
    elsewhere)."""
    rows, n = cu_seqlens.shape[0] - 1, x.shape[1]
    if not triton_available(x.device):
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        seg = torch.repeat_interleave(torch.arange(rows, device=x.device), lengths)
        real = len(seg)
        w = torch.ones(real, device=x.device) if weights is None else weights[:real].float()
        summed = torch.zeros((rows, n), device=x.device).index_add_(0, seg, x[:real].float() * w[:, None])
        norm = torch.zeros(rows, device=x.device).index_add_(0, seg, w)
        floor = torch.finfo(torch.float32).tiny if weights is not None else 1.0
        return summed / norm.clamp(min=floor)[:, None]
    x = x.contiguous()
    out = torch.empty((rows, n), dtype=torch.float32, device=x.device)
    block = 128
    _kernels().seg_mean[(rows, -(-n // block))](
        x, x if weights is None else weights, cu_seqlens, out, n, WEIGHTED=weights is not None, TOKENS=16, BD=block
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
