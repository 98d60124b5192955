"""The unpadded (packed) forward: packing round trips, per-layer equality with the padded HF forward, the gate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding import forward as forward_module
from bertflow.encoding.packed import (
    ATTENTIONS,
    SLOTTED,
    PackedBert,
    Packing,
    max_cosine_deviation,
    padded_attention,
    unsupported_reason,
    uses_slots,
)
from bertflow.encoding.settings import EncodeSettings

from ..conftest import SENTENCES, make_tiny_bert

LENGTHS = [7, 1, 5, 7, 3]


def test_packing_round_trip():
    lengths = torch.tensor(LENGTHS)
    p = Packing.from_lengths(lengths, width=7, total=sum(LENGTHS))
    assert p.cu_seqlens.tolist() == [0, 7, 8, 13, 20, 23] and p.cu_seqlens.dtype == torch.int32
    assert p.positions.tolist() == [*range(7), 0, *range(5), *range(7), *range(3)]
    assert p.mask.sum(1).tolist() == LENGTHS
    padded = torch.randn(5, 7, 3)
    packed = p.pack(padded)
    assert packed.shape == (23, 3)
    torch.testing.assert_close(packed[8:13], padded[2, :5], rtol=0, atol=0)
    back = p.unpack(packed)
    torch.testing.assert_close(back, padded * p.mask[..., None], rtol=0, atol=0)  # zeros at padding
    torch.testing.assert_close(p.pack(back), packed, rtol=0, atol=0)
    assert p.unpack(packed, rows=6)[5].eq(0).all()  # one more row, of padding


def test_packing_grown_to_a_bucket_keeps_every_token(tiny_bert):
    """A packing grown to a multiple of ``bucket`` tokens: rows of padding (token 0, position 0) after the real
    tokens, which every unpack drops; the layers' states at real tokens equal the ungrown packing's."""
    lengths = torch.tensor(LENGTHS)
    plain = Packing.from_lengths(lengths, 7, sum(LENGTHS), lengths.numpy())
    p = Packing.from_lengths(lengths, 7, sum(LENGTHS), lengths.numpy(), bucket=16)
    assert (p.total, p.real, plain.total, plain.real) == (32, 23, 23, 23)
    assert p.positions[23:].eq(0).all() and p.cu_seqlens.equal(plain.cu_seqlens) and p.tiles == plain.tiles
    padded = torch.randn(5, 7, 3)
    packed = p.pack(padded)
    assert packed.shape == (32, 3) and packed[23:].eq(0).all() and packed[:23].equal(plain.pack(padded))
    assert p.unpack(packed).equal(plain.unpack(packed[:23]))
    ids = torch.randint(5, tiny_bert.config.vocab_size, (5, 7))
    with torch.inference_mode():
        for name in ("segments", "padded"):
            got = PackedBert(tiny_bert, "fused").states(ids, p, [3], ATTENTIONS[name])[3]
            ref = PackedBert(tiny_bert, "fused").states(ids, plain, [3], ATTENTIONS[name])[3]
            assert got.shape[0] == 32 and torch.isfinite(got).all()
            torch.testing.assert_close(got[:23], ref, rtol=1e-5, atol=1e-5)


def test_padded_attention_is_per_sentence():
    """Each sentence attends to itself only: its output does not change when another sentence does."""
    torch.manual_seed(0)
    p = Packing.from_lengths(torch.tensor(LENGTHS), width=7, total=sum(LENGTHS))
    q, k, v = (torch.randn(23, 2, 4) for _ in range(3))
    out = padded_attention(q, k, v, p)
    # Sentence 2 (packed rows 8:13) alone, by plain softmax attention.
    scores = torch.einsum("qhd,khd->hqk", q[8:13], k[8:13]) / 2.0
    alone = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[8:13])
    torch.testing.assert_close(out[8:13], alone, rtol=1e-5, atol=1e-5)
    k2 = k.clone()
    k2[:8] += 5.0  # other sentences' keys
    torch.testing.assert_close(padded_attention(q, k2, v, p)[8:13], out[8:13], rtol=0, atol=0)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from transformers import BertModel

    folder = make_tiny_bert(tmp_path_factory.mktemp("packed-bert"), seed=3, layers=3)
    return BertModel.from_pretrained(folder, attn_implementation="sdpa").eval()


def test_packed_layers_equal_padded_hf_forward(tiny_bert):
    """Every hidden state of the packed forward equals the padded HF forward's at real tokens (fp32, CPU)."""
    torch.manual_seed(1)
    lengths = torch.tensor(LENGTHS)
    width = int(lengths.max())
    ids = torch.randint(5, tiny_bert.config.vocab_size, (len(LENGTHS), width))
    p = Packing.from_lengths(lengths, width, int(lengths.sum()))
    ids[~p.mask] = 0
    with torch.inference_mode():
        ref = tiny_bert(input_ids=ids, attention_mask=p.mask.long(), output_hidden_states=True).hidden_states
        states = PackedBert(tiny_bert).states(ids, p, [0, 1, 2, 3], padded_attention)
    assert sorted(states) == [0, 1, 2, 3]
    for k, packed in states.items():
        torch.testing.assert_close(packed, p.pack(ref[k]), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():  # layers above the highest one asked for are not run
        assert sorted(PackedBert(tiny_bert).states(ids, p, [2], padded_attention)) == [2]


@pytest.mark.parametrize("name", sorted(SLOTTED))
@pytest.mark.parametrize("width", [8, 40, 70])
def test_slotted_layout_equals_padded_hf_forward(tiny_bert, width, name):
    """The slots layout (padded batch grown to whole attention groups, attention on views) gives the padded HF
    forward's states at every real token, with one or several sentences per attention row; padding rows get
    finite values."""
    torch.manual_seed(width)
    lengths = torch.tensor([min(n * width // 7, width) or 1 for n in LENGTHS])
    ids = torch.randint(5, tiny_bert.config.vocab_size, (len(LENGTHS), width))
    p = Packing.slots(lengths, width)
    assert p.total % width == 0 and p.total // width >= len(LENGTHS)
    ids[~p.mask] = 0
    with torch.inference_mode():
        ref = tiny_bert(input_ids=ids, attention_mask=p.mask.long(), output_hidden_states=True).hidden_states
        for kernels in ("modules", "fused"):
            states = PackedBert(tiny_bert, kernels=kernels).states(ids, p, [1, 3], ATTENTIONS[name])
            for k, flat in states.items():
                assert torch.isfinite(flat).all()
                got = p.unpack(flat)
                assert got.shape == (len(LENGTHS), width, tiny_bert.config.hidden_size)
                torch.testing.assert_close(got[p.mask], ref[k][p.mask], rtol=1e-5, atol=1e-5)
    assert uses_slots(ATTENTIONS[name]) and not uses_slots(padded_attention)
    with pytest.raises(ValueError, match="slots"):
        q = torch.zeros(int(lengths.sum()), 2, 4)
        ATTENTIONS[name](q, q, q, Packing.from_lengths(lengths, width, int(lengths.sum())))
    with pytest.raises(ValueError, match="group_bias needs a Packing.slots layout"):
        Packing.from_lengths(lengths, width, int(lengths.sum())).group_bias(torch.float32)


def test_segment_attention_is_padded_attention_off_cuda(tiny_bert):
    """On CPU the packed attention is the padded one (no kernel), and it refuses the slots layout."""
    lengths = torch.tensor([7, 1, 5])
    p = Packing.from_lengths(lengths, 7, 13, lengths.numpy())
    q, k, v = (torch.randn(13, 2, 4) for _ in range(3))
    assert ATTENTIONS["segments"](q, k, v, p).equal(padded_attention(q, k, v, p))
    with pytest.raises(ValueError, match="packed layout"):
        ATTENTIONS["segments"](q, k, v, Packing.slots(lengths, 7))


@pytest.mark.parametrize("kernels", ["fused", "fused-gelu"])
def test_fused_layers_equal_padded_hf_forward(tiny_bert, kernels):
    """The fused layer (one QKV GEMM, add + LayerNorm together, GELU in the GEMM) computes the model's function:
    fp32 on CPU, against the padded HF forward (with the tanh GELU in the model for ``fused-gelu``)."""
    import copy

    from transformers.activations import ACT2FN

    model = tiny_bert
    if kernels == "fused-gelu":
        model = copy.deepcopy(tiny_bert)
        for layer in model.encoder.layer:
            layer.intermediate.intermediate_act_fn = ACT2FN["gelu_pytorch_tanh"]
    torch.manual_seed(2)
    lengths = torch.tensor(LENGTHS)
    width = int(lengths.max())
    ids = torch.randint(5, model.config.vocab_size, (len(LENGTHS), width))
    p = Packing.from_lengths(lengths, width, int(lengths.sum()))
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=p.mask.long(), output_hidden_states=True).hidden_states
        states = PackedBert(tiny_bert, kernels=kernels).states(ids, p, [1, 3], padded_attention)
    for k, packed in states.items():
        torch.testing.assert_close(packed, p.pack(ref[k]), rtol=1e-5, atol=1e-5)


def test_fused_qkv_follows_weight_changes(tiny_bert):
    """The concatenated QKV weight is a copy: a weight changed in place after the first forward is picked up."""
    import copy

    model = copy.deepcopy(tiny_bert)
    packed = PackedBert(model, kernels="fused")
    lengths = torch.tensor(LENGTHS)
    p = Packing.from_lengths(lengths, int(lengths.max()), int(lengths.sum()))
    ids = torch.randint(5, model.config.vocab_size, (len(LENGTHS), int(lengths.max())))
    with torch.inference_mode():
        before = packed.states(ids, p, [3], padded_attention)[3]
    with torch.no_grad():
        model.encoder.layer[0].attention.self.key.weight.mul_(0.5)
    with torch.inference_mode():
        after = packed.states(ids, p, [3], padded_attention)[3]
        ref = PackedBert(model).states(ids, p, [3], padded_attention)[3]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="kernels must be one of"):
        PackedBert(model, kernels="fast")


def test_unsupported_models_are_named(tiny_bert):
    from transformers import BertConfig, BertForMaskedLM, BertModel

    assert unsupported_reason(tiny_bert) is None
    small = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    assert "not a BertModel" in unsupported_reason(BertForMaskedLM(BertConfig(**small)))
    assert "decoder" in unsupported_reason(BertModel(BertConfig(is_decoder=True, **small)))
    with pytest.raises(ValueError, match="not supported"):
        PackedBert(torch.nn.Linear(2, 2))


POOLINGS = ["mean", "cls", "pooler", "first-last-avg", [0, 2]]


def test_encoder_unpadded_equals_padded(tiny_model_dir):
    """unpadded=True (CPU: padded attention only) gives the padded path's vectors for every pooling."""
    sentences = SENTENCES * 3 + ["x", "a man"]
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", settings=EncodeSettings(unpadded=False))
    ref = enc.encode(sentences, poolings=POOLINGS)
    enc.settings = dataclasses.replace(enc.settings, unpadded=True, max_tokens=64)  # several batches, some uniform
    got = enc.encode(sentences, poolings=POOLINGS)
    assert enc.last_stats.batches > 1 and enc.last_stats.uniform_batches >= 1
    assert ref.keys() == got.keys()
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-5, err_msg=key)


def test_encoder_unpadded_off_cpu_by_default_and_refused_for_other_models(tiny_model_dir):
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    assert enc.settings.unpadded is None and enc._runner.packed_attention(None) is None  # a CUDA default only
    other = BertForMaskedLM(BertConfig(**{**enc.model.config.to_dict(), "is_decoder": False}))
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    odd = SentenceEncoder("odd", model=other, tokenizer=tok, device="cpu", settings=EncodeSettings(unpadded=True))
    with pytest.raises(InputError, match="unpadded encoding is not available: BertForMaskedLM"):
        odd.encode(SENTENCES)
    with pytest.raises(InputError, match="unpadded must be None, True or False"):
        EncodeSettings(unpadded="yes")


def test_max_cosine_deviation():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert max_cosine_deviation(a, a * 3) == pytest.approx(0.0, abs=1e-7)
    assert max_cosine_deviation(a, torch.tensor([[1.0, 0.0], [2.0, 0.0]])) == pytest.approx(1.0)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("name", sorted(ATTENTIONS))
def test_attentions_equal_padded_attention_cuda(name):
    torch.manual_seed(0)
    lengths = torch.tensor([64, 1, 17, 33, 64, 5, 60, 58], device="cuda")
    p = Packing.from_lengths(lengths, 64, int(lengths.sum()), lengths.cpu().numpy())
    q, k, v = (torch.randn(p.total, 12, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = padded_attention(q.float(), k.float(), v.float(), p)
    if name in SLOTTED:  # same tokens in the slots layout; compared at real tokens
        s = Packing.slots(lengths, 64)
        q, k, v = (s.pack(p.unpack(t)) for t in (q, k, v))
        got = p.pack(s.unpack(ATTENTIONS[name](q, k, v, s))).float()
    else:
        got = ATTENTIONS[name](q, k, v, p).float()
    assert torch.linalg.norm(got - ref) / torch.linalg.norm(ref) < 1e-2


@cuda
def test_encoder_unpadded_equals_padded_cuda(tmp_path):
    """On CUDA in bf16 the unpadded forward matches the padded one (1 - cos <= 1e-3), asked for or by default."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = make_tiny_bert(tmp_path / "m", seed=5, hidden=128, layers=4)
    tok = BertTokenizerFast.from_pretrained(folder)
    config = BertConfig.from_pretrained(folder)
    torch.manual_seed(5)
    model = BertModel(config)
    sentences = [f"{s} {i}" for i in range(300) for s in SENTENCES]
    settings = EncodeSettings(unpadded=False, max_tokens=4096, min_tokens=0, tokenize_processes=0)
    enc = SentenceEncoder("m", model=model, tokenizer=tok, device="cuda", settings=settings)
    assert enc.dtype == torch.bfloat16
    for pooling in POOLINGS:
        enc.settings = dataclasses.replace(settings, unpadded=False)
        (ref,) = enc.encode(sentences, poolings=[pooling]).values()
        for flag in (True, None) if forward_module.UNPADDED_BY_DEFAULT else (True,):
            enc.settings = dataclasses.replace(settings, unpadded=flag)
            (got,) = enc.encode(sentences, poolings=[pooling]).values()
            assert max_cosine_deviation(torch.from_numpy(got), torch.from_numpy(ref)) <= 1e-3, (pooling, flag)
    if forward_module.UNPADDED_BY_DEFAULT:
        assert enc._runner.packed_verified and enc._runner.unpadded_refused is None
    from bertflow.encoding.fused import triton_available

    if triton_available(torch.device("cuda")):  # the packed layout with its kernel, batches not bounding padding
        assert enc._runner.cuda_attention is ATTENTIONS["segments"] and enc._runner.padding_free(None)
