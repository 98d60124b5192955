"""The packed forward of CUDA graphs (encoding/graphs.py): token buckets, the host layout, the attention runs, the
forward it replays (eager on CPU, against the padded HF forward), and on CUDA the graphs themselves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bertflow import SentenceEncoder
from bertflow.encoding import fused
from bertflow.encoding.graphs import (
    BUCKET_MULTIPLE,
    MIN_BUCKET,
    STEPS_PER_OCTAVE,
    GraphForward,
    attention_runs,
    bucket,
    buckets_up_to,
    layout,
    supports,
    unpack_layout,
)
from bertflow.encoding.packed import PackedBert
from bertflow.encoding.pooling import Pooling
from bertflow.encoding.settings import EncodeSettings
from bertflow.encoding.tokenization import TokenArrays

from ..conftest import SENTENCES, make_tiny_bert

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from transformers import BertModel

    folder = make_tiny_bert(tmp_path_factory.mktemp("graphed-bert"), seed=4, layers=3)
    return BertModel.from_pretrained(folder, attn_implementation="sdpa").eval()


def _tokens(lengths: list[int], seed: int = 0, vocab: int = 50) -> TokenArrays:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TokenArrays(rng.integers(5, vocab, size=int(offsets[-1])).astype(np.int32), offsets)


def test_buckets_hold_the_tokens_and_are_few():
    sizes = [bucket(t) for t in range(1, 300_000, 97)]
    assert all(s >= t for s, t in zip(sizes, range(1, 300_000, 97), strict=True))
    assert all(s % BUCKET_MULTIPLE == 0 and s >= MIN_BUCKET for s in sizes)
    assert sizes == sorted(sizes)  # monotone
    assert bucket(MIN_BUCKET) == MIN_BUCKET and bucket(MIN_BUCKET + 1) > MIN_BUCKET
    # at most one step of the ladder above the tokens (plus the rounding to a multiple)
    worst = max(bucket(t) / t for t in range(MIN_BUCKET + 1, 300_000, 13))
    assert worst <= 2 ** (1 / STEPS_PER_OCTAVE) + BUCKET_MULTIPLE / MIN_BUCKET
    assert len(set(sizes)) <= STEPS_PER_OCTAVE * 9 + 1  # 1,024 .. 300k: about 8.2 doublings
    assert bucket(65536) == 65536 and bucket(65535) == 65536  # the default budget of a graphed batch is a bucket
    assert buckets_up_to(5000) == [1024, 2048, 4096, 8192] and buckets_up_to(10) == [MIN_BUCKET]


@pytest.mark.parametrize("seed", range(4))
def test_attention_runs_cover_every_sentence_once_within_its_tile(seed):
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(1, fused.TILE_MAX + 1, size=200))[::-1]
    if seed == 3:
        lengths = rng.permutation(lengths)  # any order is valid, only less grouped
    cu = np.concatenate([[0], np.cumsum(lengths)])
    runs, bounds = attention_runs(lengths, cu)
    assert bounds[0] == 0 and bounds[-1] == len(runs) and np.all(np.diff(bounds) >= 0)
    covered = np.zeros(cu[-1], dtype=int)
    for c, block in enumerate(fused.GROUP_BLOCKS):
        for t0, t1 in runs[bounds[c] : bounds[c + 1]]:
            assert 0 < t1 - t0 <= block
            covered[t0:t1] += 1
            inside = (cu[:-1] >= t0) & (cu[:-1] < t1)  # the run holds whole sentences
            assert cu[1:][inside].max() <= t1
            assert block == fused.GROUP_BLOCKS[0] or lengths[inside].max() > block // 2
    assert np.all(covered == 1)
    if seed < 3:  # sorted: sentences that fit twice in a tile share one run
        assert len(runs) < len(lengths)


def test_layout_round_trip():
    lengths = [9, 7, 7, 3, 2]
    tokens = _tokens([4, *lengths])  # row 0 is not in the batch
    rows = np.arange(1, 6)
    x = layout(tokens, rows, pad_id=0)
    size = bucket(sum(lengths))
    assert x.shape == (4, size) and x.dtype == torch.int32
    ids, positions, cu, bounds, runs = unpack_layout(x)
    total = sum(lengths)
    assert ids[:total].tolist() == tokens.ids[4 : 4 + total].tolist() and ids[total:].eq(0).all()
    assert positions[:total].tolist() == [p for n in lengths for p in range(n)] and positions[total:].eq(0).all()
    assert cu[:6].tolist() == [0, 9, 16, 23, 26, 28] and cu[6:].eq(total).all() and len(cu) == size // 2 + 1
    assert runs.shape == (size // 2, 2)
    want_runs, want_bounds = attention_runs(np.array(lengths), np.array(cu[:6].tolist()))
    assert bounds.tolist() == want_bounds.tolist()
    assert runs[: len(want_runs)].tolist() == want_runs.tolist() and runs[len(want_runs) :].eq(0).all()


def test_layout_refuses_what_no_graph_takes():
    assert layout(_tokens([fused.TILE_MAX + 1, 3]), np.arange(2), pad_id=0) is None  # over the attention tile
    assert layout(_tokens([0, 3]), np.arange(2), pad_id=0) is None  # an empty sentence
    assert layout(_tokens([1] * 600), np.arange(600), pad_id=0) is None  # more sentences than T // 2
    assert layout(_tokens([2] * 512), np.arange(512), pad_id=0) is not None


POOLINGS = ["mean", "first-last-avg", "cls", "sif:mean", "pooler", "0,2"]


def _padded_reference(model, tokens, poolings, tables):
    """Each pooling of the padded HF forward (the reference of every forward), float32 [n, D]."""
    lengths = tokens.lengths
    width = int(lengths.max())
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, (a, b) in enumerate(zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)):
        ids[i, : b - a] = torch.from_numpy(tokens.ids[a:b].astype(np.int64))
    mask = torch.arange(width)[None, :] < torch.from_numpy(lengths)[:, None]
    out = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
    states = {i: h.float() for i, h in enumerate(out.hidden_states)} | {"pooler_output": out.pooler_output.float()}
    result = []
    for p in poolings:
        weights = tables[p.weighting.spec][ids] if p.weighting.weighted else None
        result.append(p.pool(states, mask, weights))
    return torch.cat(result, dim=1)


@pytest.mark.parametrize("kernels", ["modules", "fused"])
def test_graph_forward_equals_the_padded_forward_on_cpu(tiny_bert, kernels):
    """The function the graphs replay, run eagerly on CPU (torch attention and pooling): every graphed pooling of
    the batch's sentences equals the padded HF forward's, and the bucket's padding rows pool to nothing."""
    n_layers = tiny_bert.config.num_hidden_layers
    poolings = tuple(Pooling.parse(p, n_layers) for p in POOLINGS)
    assert supports(poolings)
    layers = tuple(sorted({i for p in poolings for i in p.layers} | {n_layers}))
    tables = {"sif": torch.rand(tiny_bert.config.vocab_size) + 0.1}
    tokens = _tokens([17, 12, 12, 9, 8, 8, 5, 4, 3, 2, 2], seed=1, vocab=tiny_bert.config.vocab_size)
    x = layout(tokens, np.arange(len(tokens)), pad_id=0)
    forward = GraphForward(PackedBert(tiny_bert, kernels), torch.device("cpu"))._forward(poolings, layers, tables)
    with torch.inference_mode():
        got = forward(x)
        want = _padded_reference(tiny_bert, tokens, poolings, tables)
    assert got.shape == (x.shape[1] // 2, want.shape[1]) and got.dtype == torch.float32
    torch.testing.assert_close(got[: len(tokens)], want, rtol=1e-5, atol=1e-5)
    mean_cols = slice(0, tiny_bert.config.hidden_size)
    assert got[len(tokens) :, mean_cols].eq(0).all()


def test_graphs_are_not_supported_for_every_pooling():
    class Odd(Pooling):  # a pooling the graphs do not know (not registered: no names)
        layers = (1,)
        base_name = "odd"

        def base_spec(self):
            return "odd"

        def pool(self, states, mask, weights=None):
            return states[1][:, 0]

        @classmethod
        def build(cls, name, num_layers, weighting):
            return None

    assert not supports((Pooling.parse("mean", 3), Odd()))


def test_settings_say_when_graphs_run():
    assert EncodeSettings(graphs=True).uses_graphs(768) and not EncodeSettings(graphs=False).uses_graphs(384)
    assert EncodeSettings().uses_graphs(384) and not EncodeSettings().uses_graphs(768)  # narrow models by default
    with pytest.raises(Exception, match="graphs"):
        EncodeSettings(graphs="yes")


# -- CUDA: the graphs -------------------------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("pooling", ["mean", "first-last-avg", "cls"])
def test_graphed_encode_equals_the_packed_forward(tmp_path, pooling):
    """On CUDA in bf16: the graphed forward's vectors equal the eager packed forward's (the same kernels but the
    pooling's summation order and the buckets' GEMM shapes), repeated encodes replay captured graphs."""
    folder = make_tiny_bert(tmp_path / "bert", hidden=64)  # heads of 16: the attention kernel's smallest
    base = EncodeSettings(unpadded=True, tokenize_processes=0, chunk_size=512, max_tokens=2048)
    corpus = [f"{s} {i}" for i in range(300) for s in SENTENCES[: 1 + i % 8]]
    encoders = {
        g: SentenceEncoder(
            str(folder),
            pooling=pooling,
            device="cuda",
            dtype="bf16",
            settings=dataclasses.replace(base, graphs=g),
        )
        for g in (False, True)
    }
    eager = encoders[False].encode(corpus)
    graphed = [encoders[True].encode(corpus) for _ in range(2)]
    runner = encoders[True]._runner
    assert runner.graphs is not None
    (captured,) = [f.shapes for f in runner.graphs._functions.values()]
    assert sorted(captured) == [(4, size) for size in buckets_up_to(65536)]  # every bucket, at the first batch
    for got in graphed:
        cos = (got * eager).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(eager, axis=1)
        assert 1 - cos.min() < 1e-3
    np.testing.assert_array_equal(graphed[0], graphed[1])  # replays are deterministic


def test_packed_batches_count_real_tokens():
    from bertflow.encoding.batching import plan_packed_batches

    lengths = np.array([9, 7, 7, 5, 5, 5, 3, 2, 2, 2])
    batches = plan_packed_batches(lengths, max_tokens=16)
    assert batches == [(0, 2), (2, 4), (4, 8), (8, 10)]  # 9+7 | 7+5 | 5+5+3+2 | 2+2
    assert plan_packed_batches(lengths, max_tokens=4) == [(i, i + 1) for i in range(6)] + [(6, 7), (7, 9), (9, 10)]
    assert plan_packed_batches(lengths, max_tokens=100, max_rows=4) == [(0, 4), (4, 8), (8, 10)]
    assert plan_packed_batches(np.array([], dtype=int), 8) == []
    with pytest.raises(Exception, match="positive"):
        plan_packed_batches(lengths, 0)
