"""The Triton kernels (encoding/triton_kernels.py) against their torch references on Triton's CPU interpreter,
wherever Triton is installed (the CUDA tests of tests/encoding/test_fused.py and test_graphs.py run them compiled)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertflow.encoding import fused
from bertflow.encoding.graphs import attention_runs


def test_kernels_on_the_triton_interpreter():
    """Every kernel, and the attention wrappers' launches of them, agree with their torch references, run by Triton's
    CPU interpreter in a fresh process (the interpreter must be chosen before Triton is first imported)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = "from tests.encoding.test_triton_kernels import check_kernels; check_kernels()"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("kernels ok")


def check_kernels() -> None:
    """Compare every kernel with its reference (run by :func:`test_kernels_on_the_triton_interpreter`)."""
    from bertflow.encoding import triton_kernels as kernels

    torch.manual_seed(0)
    lengths = np.array([70, 37, 30, 20, 15, 15, 9, 8, 8, 5, 3, 2])
    cu = np.concatenate([[0], np.cumsum(lengths)])
    total, heads, d = int(cu[-1]) + 11, 2, 16
    q, k, v = torch.randn(total, 3, heads, d).unbind(1)  # views of one tensor, as the QKV GEMM gives
    positions = torch.zeros(total, dtype=torch.long)
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        positions[a:b] = torch.arange(b - a)
    runs, bounds = (torch.from_numpy(t) for t in attention_runs(lengths, cu))
    want = fused._grouped_attention_reference(q, k, v, positions, runs, bounds)
    got = torch.zeros_like(q)
    for c, block in enumerate(fused.GROUP_BLOCKS):
        kernels.group_attn[(3, heads)](
            q, k, v, positions, got, runs, bounds, c, d**-0.5, *q.stride()[:2], *got.stride()[:2], BLOCK=block, D=d
        )
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    packed = torch.zeros_like(q)  # the packed forward's kernel, sharing the tile's code, on the same sentences
    cu_t = torch.from_numpy(cu).to(torch.int32)
    for block, first, last, per in fused.segment_tiles(lengths):
        kernels.segment_attn[(-(-(last - first) // per), heads)](
            q,
            k,
            v,
            cu_t,
            positions,
            packed,
            first,
            last,
            per,
            d**-0.5,
            *q.stride()[:2],
            *packed.stride()[:2],
            BLOCK=block,
            D=d,
        )
    torch.testing.assert_close(packed, want, rtol=1e-4, atol=1e-5)
    # The wrappers' own launches (their grids, argument order and strides), with the kernel's guard forced open:
    # off CUDA they would take their torch references.
    fused.segment_attention_fits = lambda q, width: True
    torch.testing.assert_close(fused.grouped_attention(q, k, v, positions, runs, bounds), want, rtol=1e-4, atol=1e-5)
    wrapped = fused.segment_attention(q, k, v, cu_t, positions, fused.segment_tiles(lengths))
    torch.testing.assert_close(wrapped[: cu[-1]], want[: cu[-1]], rtol=1e-4, atol=1e-5)
    for a, b in zip(cu[:-1], cu[1:], strict=True):  # the reference is attention within each sentence
        one = torch.nn.functional.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)))
        torch.testing.assert_close(want[a:b], one.transpose(0, 1), rtol=1e-4, atol=1e-5)
    assert want[cu[-1] :].eq(0).all()

    cu_rows = torch.tensor([0, 17, 20, 20, 53, 53], dtype=torch.int32)  # two empty sentences
    x = torch.randn(60, 40)
    for weights in (None, torch.rand(60) + 0.1):
        got = torch.empty(5, 40)
        kernels.seg_mean[(5, 1)](
            x, x if weights is None else weights, cu_rows, got, 40, WEIGHTED=weights is not None, TOKENS=16, BD=64
        )
        want = fused.segment_mean(x, cu_rows, weights)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        w = torch.ones(60) if weights is None else weights
        torch.testing.assert_close(want[0], (x[:17] * w[:17, None]).sum(0) / w[:17].sum(), rtol=1e-5, atol=1e-6)
        assert want[2].eq(0).all() and want[4].eq(0).all()

    y, r = torch.randn(2, 37, 48).unbind(0)  # add + LayerNorm, rows not a multiple of ROWS, width not of BLOCK
    w, b = torch.randn(48), torch.randn(48)
    out = torch.empty_like(y)
    kernels.add_ln[(-(-37 // 8),)](y, r, w, b, out, 37, 48, 1e-12, ROWS=8, BLOCK=64)
    torch.testing.assert_close(out, F.layer_norm(y + r, (48,), w, b, 1e-12), rtol=1e-4, atol=1e-5)
    print("kernels ok")
