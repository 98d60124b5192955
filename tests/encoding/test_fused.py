"""The fused steps of the unpadded layer (encoding/fused.py): the packed attention's launch plan, the CPU fallbacks,
and on CUDA the Triton kernels against plain torch in float32 (tests/encoding/test_triton_kernels.py runs them on
Triton's CPU interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertflow.encoding import fused
from bertflow.encoding.packed import ATTENTIONS, Packing, padded_attention

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("seed", range(6))
def test_segment_tiles_cover_every_sentence_in_order(seed):
    """The packed attention's launches cover the sentences once, in order; each program's tile holds its ``per``
    sentences; sorted lengths take at most one launch per (tile, count) kind, any order at most MAX_TILE_RUNS."""
    from bertflow.encoding.fused import MAX_TILE_RUNS, segment_tiles

    gen = np.random.default_rng(seed)
    lengths = gen.integers(1, 129, int(gen.integers(1, 300)))
    for lens in (np.sort(lengths)[::-1], lengths):
        tiles = segment_tiles(lens)
        assert tiles[0][1] == 0 and tiles[-1][2] == len(lens) and len(tiles) <= MAX_TILE_RUNS
        for (block, first, last, per), nxt in zip(tiles, [*tiles[1:], None], strict=True):
            assert first < last and (nxt is None or nxt[1] == last)
            assert block >= 16 and block & (block - 1) == 0 and per >= 1 and per & (per - 1) == 0
            assert per * lens[first:last].max() <= block
    assert segment_tiles(np.array([], dtype=np.int64)) == ()
    assert segment_tiles(np.array([20, 18, 9, 8, 5, 2])) == ((32, 0, 2, 1), (16, 2, 3, 1), (16, 3, 5, 2), (16, 5, 6, 8))


def test_cpu_fallbacks_are_the_modules_ops():
    """Off CUDA: add + LayerNorm is the module on the sum, the GELU GEMM is tanh-GELU of the Linear, QKV is the
    three projections side by side, and the attention kernel is not used."""
    torch.manual_seed(0)
    norm, dense = torch.nn.LayerNorm(8), torch.nn.Linear(8, 12)
    y, r = torch.randn(5, 8), torch.randn(5, 8)
    assert fused.add_layer_norm(y, r, norm).equal(norm(y + r))
    torch.testing.assert_close(fused.linear_gelu(y, dense), F.gelu(dense(y), approximate="tanh"))
    attn = torch.nn.Module()
    attn.query, attn.key, attn.value = (torch.nn.Linear(8, 8) for _ in range(3))
    weight, bias = fused.qkv_weights(attn)
    torch.testing.assert_close(F.linear(y, weight, bias), torch.cat([attn.query(y), attn.key(y), attn.value(y)], 1))
    cpu = torch.device("cpu")
    assert not fused.triton_available(cpu) and not fused.attention_kernel_fits(cpu, torch.bfloat16, 64)
    assert not fused.segment_attention_fits(torch.zeros(3, 2, 64, dtype=torch.bfloat16), 8)


@cuda
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_segment_attention_kernel_cuda(head_dim, order):
    """The Triton packed attention equals padded attention in float32 at every token (to bf16 rounding), for
    sentences of 1-128 tokens, length-sorted (a few launches) or shuffled (one launch, largest tile), on strided
    q/k/v views of one QKV tensor; a sentence's output does not depend on the other sentences; the packed
    attention takes the kernel where it fits."""
    from bertflow.encoding.fused import segment_attention, segment_attention_fits, segment_tiles

    gen = np.random.default_rng(head_dim)
    host = np.concatenate([[128, 1, 2, 16, 17, 64, 65], gen.integers(1, 129, 90), gen.integers(2, 20, 200)])
    host = np.sort(host)[::-1].copy() if order == "sorted" else gen.permutation(host)
    lengths = torch.from_numpy(host).cuda()
    p = Packing.from_lengths(lengths, 128, int(host.sum()), host)
    assert (len(p.tiles) > 1) == (order == "sorted")
    torch.manual_seed(head_dim)
    qkv = torch.randn(p.total, 3, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(1)
    if not segment_attention_fits(q, 128):
        pytest.skip("needs Triton")
    assert not segment_attention_fits(q, 129) and not segment_attention_fits(q.float(), 128)
    got = segment_attention(q, k, v, p.cu_seqlens, p.positions, segment_tiles(host))
    assert got.shape == q.shape and torch.isfinite(got).all()
    ref = padded_attention(q.float(), k.float(), v.float(), p)
    assert float(torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref)) < 1e-2
    first = int(host[0])
    k2 = k.clone()
    k2[first:] += 3.0  # every sentence but the first changes: the first one's output must not
    again = segment_attention(q, k2, v, p.cu_seqlens, p.positions, p.tiles)
    torch.testing.assert_close(again[:first], got[:first], rtol=0, atol=0)
    assert ATTENTIONS["segments"](q, k, v, p).equal(got)


@cuda
@pytest.mark.parametrize("hidden", [384, 768, 1000])
def test_add_layer_norm_kernel_cuda(hidden):
    """The Triton add + LayerNorm equals LayerNorm(y + r) computed in float32, to bf16 rounding; every row written."""
    from bertflow.encoding.fused import add_layer_norm, triton_available

    if not triton_available(torch.device("cuda")):
        pytest.skip("needs Triton")
    torch.manual_seed(hidden)
    norm = torch.nn.LayerNorm(hidden, eps=1e-12).cuda()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
        norm.bias.normal_(0.0, 0.2)
    norm = norm.to(torch.bfloat16)
    y, r = (torch.randn(1237, hidden, device="cuda", dtype=torch.bfloat16) * 3 + 1 for _ in range(2))
    with torch.inference_mode():
        got = add_layer_norm(y, r, norm).float()
        ref = torch.nn.functional.layer_norm(
            y.float() + r.float(), (hidden,), norm.weight.float(), norm.bias.float(), 1e-12
        )
    assert torch.isfinite(got).all()
    assert float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) < 5e-3
