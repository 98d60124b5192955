"""The Triton kernels of the unpadded forward (:mod:`bertflow.encoding.fused` launches them).

Imported only where Triton is (:func:`bertflow.encoding.fused.triton_available`, or the CPU interpreter in the
tests): the kernels are module-level functions, so that Triton resolves the tile body they share
(:func:`attend_tile`) and its interpreter runs them too.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["m"])  # the row count changes every batch: one compiled kernel for all
def add_ln(y_ptr, r_ptr, w_ptr, b_ptr, o_ptr, m, n, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """LayerNorm(y + r) of ``ROWS`` rows of ``n`` values, statistics in float32."""
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


@triton.jit
def attend_tile(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    o_ptr,
    t0,
    t1,
    scale,
    s_tok,
    s_head,
    o_tok,
    o_head,
    BLOCK: tl.constexpr,
    D: tl.constexpr,
):
    """Attention of tokens ``t0 .. t1 - 1`` (whole sentences, at most ``BLOCK``) for this program's head: the tile's
    q, k, v, scores, softmax and output in registers. A token's sentence is told by where that sentence starts
    (token - position), so no mask is read."""
    i = tl.arange(0, BLOCK)
    tok = t0 + i
    inside = tok < t1
    start = tok - tl.load(pos_ptr + tok, mask=inside, other=0).to(tl.int32)
    d = tl.arange(0, D)
    at = tok.to(tl.int64)[:, None] * s_tok + tl.program_id(1) * s_head + d[None, :]
    q = tl.load(q_ptr + at, mask=inside[:, None], other=0.0)
    k = tl.load(k_ptr + at, mask=inside[:, None], other=0.0)
    v = tl.load(v_ptr + at, mask=inside[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    # A query sees the tokens of its own sentence; a slot past the tile's tokens sees itself only (never stored).
    seen = ((start[:, None] == start[None, :]) & inside[None, :]) | (i[:, None] == i[None, :])
    s = tl.where(seen, s, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=1)[:, None])
    out = tl.dot(p.to(v.dtype), v) / tl.sum(p, axis=1)[:, None]
    to = tok.to(tl.int64)[:, None] * o_tok + tl.program_id(1) * o_head + d[None, :]
    tl.store(o_ptr + to, out.to(o_ptr.dtype.element_ty), mask=inside[:, None])


# Batch sizes vary: the run bounds are not specialised.
@triton.jit(do_not_specialize=["first", "last", "per"])
def segment_attn(
    q_ptr,
    k_ptr,
    v_ptr,
    cu_ptr,
    pos_ptr,
    o_ptr,
    first,
    last,
    per,
    scale,
    s_tok,
    s_head,
    o_tok,
    o_head,
    BLOCK: tl.constexpr,
    D: tl.constexpr,
):
    """One program per (run of ``per`` consecutive sentences from ``first``, head), the run's tokens contiguous from
    ``cu[s0]``, up to sentence ``last``."""
    s0 = first + tl.program_id(0) * per
    t0 = tl.load(cu_ptr + s0)
    t1 = tl.load(cu_ptr + tl.minimum(s0 + per, last))
    attend_tile(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, t0, t1, scale, s_tok, s_head, o_tok, o_head, BLOCK, D)


@triton.jit
def group_attn(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    o_ptr,
    groups_ptr,
    bounds_ptr,
    cls,
    scale,
    s_tok,
    s_head,
    o_tok,
    o_head,
    BLOCK: tl.constexpr,
    D: tl.constexpr,
):
    """The graphable form of :func:`segment_attn` (encoding/graphs.py): the runs of sentences ("groups", token
    ranges of at most ``BLOCK`` tokens) come from a table on the device, and a fixed grid of programs loops over
    class ``cls``'s groups, so one launch serves every batch of a graph's shape."""
    g = tl.load(bounds_ptr + cls) + tl.program_id(0)
    hi = tl.load(bounds_ptr + cls + 1)
    while g < hi:
        t0 = tl.load(groups_ptr + 2 * g)
        t1 = tl.load(groups_ptr + 2 * g + 1)
        attend_tile(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, t0, t1, scale, s_tok, s_head, o_tok, o_head, BLOCK, D)
        g += tl.num_programs(0)


@triton.jit
def seg_mean(x_ptr, w_ptr, cu_ptr, o_ptr, n, WEIGHTED: tl.constexpr, TOKENS: tl.constexpr, BD: tl.constexpr):
    """Mean of each sentence's token states (tokens ``cu[r] .. cu[r+1]-1``), optionally weighted, in float32, tokens
    summed in a fixed order (deterministic, unlike atomics)."""
    r = tl.program_id(0)
    t0 = tl.load(cu_ptr + r)
    t1 = tl.load(cu_ptr + r + 1)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    dmask = d < n
    acc = tl.zeros((BD,), dtype=tl.float32)
    norm = tl.zeros((TOKENS,), dtype=tl.float32)
    t = t0
    while t < t1:
        tok = t + tl.arange(0, TOKENS)
        inside = tok < t1
        x = tl.load(
            x_ptr + tok.to(tl.int64)[:, None] * n + d[None, :], mask=inside[:, None] & dmask[None, :], other=0.0
        ).to(tl.float32)
        if WEIGHTED:
            w = tl.load(w_ptr + tok, mask=inside, other=0.0).to(tl.float32)
        else:
            w = inside.to(tl.float32)
        acc += tl.sum(x * w[:, None], axis=0)
        norm += w
        t += TOKENS
    total = tl.sum(norm, axis=0)
    out = acc / tl.maximum(total, 1e-30) if WEIGHTED else acc / tl.maximum(total, 1.0)
    tl.store(o_ptr + r.to(tl.int64) * n + d, out, mask=dmask)
