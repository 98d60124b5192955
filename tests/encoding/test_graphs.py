"""CUDA graphs of the unpadded forward (encoding/graphs.py) and the warm-up at load (encoding/warmup.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding import settings as settings_module
from bertflow.encoding import warmup
from bertflow.encoding.packed import max_cosine_deviation
from bertflow.encoding.settings import EncodeSettings

from ..conftest import SENTENCES, make_tiny_bert


def test_graph_budget_follows_the_batch_floor(monkeypatch):
    """Graphs where batches are full (the floor reaches the budget: MiniLM-L6's width) when on by default or asked
    for, never off CUDA or when off; the warm-up by default on CUDA only."""
    s = EncodeSettings()
    monkeypatch.setattr(settings_module, "GRAPHS_BY_DEFAULT", True)
    assert s.graph_budget("cuda", 384, 65536) == 65536  # floor 32768 x (768/384)^2 reaches the budget
    assert s.graph_budget("cuda", 768, 65536) is None  # BERT-base: floor 32768, batches not full
    assert s.graph_budget("cpu", 384, 4096) is None
    assert dataclasses.replace(s, cuda_graphs=False).graph_budget("cuda", 384, 65536) is None
    monkeypatch.setattr(settings_module, "GRAPHS_BY_DEFAULT", False)
    assert s.graph_budget("cuda", 384, 65536) is None
    assert dataclasses.replace(s, cuda_graphs=True).graph_budget("cuda", 768, 65536) == 65536
    assert dataclasses.replace(s, cuda_graphs=True).graph_budget("cpu", 384, 4096) is None
    assert not s.warms_up("cpu") and dataclasses.replace(s, warm_up=True).warms_up("cpu")
    assert s.warms_up("cuda") == settings_module.WARM_UP_BY_DEFAULT
    for field in ("cuda_graphs", "warm_up"):
        with pytest.raises(InputError, match=field):
            EncodeSettings(**{field: 1})


def test_warm_up_changes_nothing_the_caller_sees(tiny_model_dir, monkeypatch):
    """An encoder warmed up at load gives the same vectors, and its stats are those of the caller's own encodes."""
    plain = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu", tokenize_workers=0)
    monkeypatch.setattr(warmup, "WARM_UP_SENTENCES", 128)
    settings = EncodeSettings(warm_up=True)
    calls = []
    runner_forward = type(plain._runner).forward

    def counting(self, batch, *a, **k):
        calls.append(batch.rows)
        return runner_forward(self, batch, *a, **k)

    type(plain._runner).forward = counting
    try:
        warmed = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu", settings=settings)
    finally:
        type(plain._runner).forward = runner_forward
    assert sum(calls) == 128  # the synthetic sentences went through the forward at load
    assert warmed.last_stats.sentences == 0 and warmed._token_pool is None  # no worker processes started
    np.testing.assert_allclose(warmed.encode(SENTENCES), plain.encode(SENTENCES), rtol=1e-5, atol=1e-6)
    assert warmed.last_stats.sentences == len(SENTENCES)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_graph_replays_equal_the_eager_forward_cuda(tmp_path):
    """Batches replayed from the CUDA graphs recorded at load give the eager forward's vectors (1 - cos <= 1e-3 in
    bf16), also batches with fewer rows than their graph's; without a warm-up no graph is recorded."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = make_tiny_bert(tmp_path / "m", seed=7, hidden=128, layers=3)
    tok = BertTokenizerFast.from_pretrained(folder)
    torch.manual_seed(7)
    model = BertModel(BertConfig.from_pretrained(folder))
    sentences = [f"{s} {i}" for i in range(400) for s in SENTENCES]
    base = EncodeSettings(max_tokens=2048, min_tokens=2048, tokenize_processes=0, cuda_graphs=False, warm_up=False)
    enc = SentenceEncoder("m", model=model, tokenizer=tok, device="cuda", settings=base)
    reference = torch.from_numpy(enc.encode(sentences))
    enc.settings = dataclasses.replace(base, cuda_graphs=True)
    assert max_cosine_deviation(torch.from_numpy(enc.encode(sentences)), reference) <= 1e-3
    assert enc._runner.graphs is not None and not enc._runner.graphs.graphs  # recorded at load only
    graphs = dataclasses.replace(base, cuda_graphs=True, warm_up=True)
    warmed = SentenceEncoder("m", model=model, tokenizer=tok, device="cuda", settings=graphs)
    assert len(warmed._runner.graphs.graphs) == 63  # widths 2 .. 64
    replays = []
    run = warmed._runner.graphs.run
    warmed._runner.graphs.run = lambda *a: replays.append(r := run(*a)) or r
    for _ in range(2):
        assert max_cosine_deviation(torch.from_numpy(warmed.encode(sentences)), reference) <= 1e-3
    fewer = sentences[: len(sentences) // 3]
    assert max_cosine_deviation(torch.from_numpy(warmed.encode(fewer)), reference[: len(fewer)]) <= 1e-3
    assert any(r is not None for r in replays)
