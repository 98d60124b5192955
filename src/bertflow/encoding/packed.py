"""Unpadded ("packed") forward pass of a BERT encoder: every layer runs on the real tokens of a batch only.

A padded batch ``[rows, width]`` spends compute on padding in every Linear, LayerNorm and GELU, and attention
kernels for short rows are dominated by their fixed cost. Here the real tokens of a batch are laid end to end in
one ``[total_tokens, hidden]`` tensor (:class:`Packing`), the model's own modules run on it (or, on CUDA, the
fused steps of :mod:`bertflow.encoding.fused`: :data:`KERNELS`), and attention keeps each sentence to itself, by
one of :data:`ATTENTIONS`: :func:`segment_attention` (the CUDA choice where its Triton kernel runs: on the packed
real tokens themselves, batches grown to a multiple of :data:`TOKEN_BUCKET` tokens), :func:`slotted_attention` (the
CUDA fallback: the layers run on the length-sorted padded batch grown to whole groups of ~128 token slots, so the
groups are views, and SDPA runs under a block-diagonal mask) and :func:`padded_attention` (pads for attention only:
the reference of the tests, and the CPU path). More were measured and removed: sentences side by side in rows of
~128 tokens under a block-diagonal mask over packed tokens, torch's variable-length flash kernel, and a Triton
kernel for the slotted layout, which the packed kernel replaced (docs/performance.md).

Only the exact Hugging Face ``BertModel`` (BERT, MiniLM, the raw Gutenberg encoder) is supported:
:func:`unsupported_reason` says why any other model is refused, and the padded forward is used for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from . import fused
from .fused import Tile, add_layer_norm, linear_gelu, qkv_weights, segment_attention_fits

#: Attention over packed tokens: ``(q, k, v [total, heads, head_dim], packing) -> [total, heads, head_dim]``.
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "Packing"], torch.Tensor]


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a padded ``[rows, width]`` batch go in the packed ``[total]`` order (the :attr:`real`
    tokens, then any rows of padding): ``lengths`` int32 [rows] (each >= 1); ``cu_seqlens`` int32 [rows + 1], where
    each sentence starts (last: :attr:`real`); ``index`` int64 [real], each token's flat padded position
    (``row * width + position``); ``positions`` int64 [total], its position in its sentence (0 for [CLS] and for
    padding); ``mask`` bool [rows, width]."""

    rows: int
    width: int
    total: int
    lengths: torch.Tensor
    cu_seqlens: torch.Tensor
    index: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    #: True for :meth:`slots`: the "packed" order is the padded batch itself, grown to whole attention groups.
    slotted: bool = False
    #: The launches of :func:`segment_attention` (:func:`~bertflow.encoding.fused.segment_tiles`), when the
    #: lengths were given on the host too.
    tiles: tuple[Tile, ...] = ()
    _cache: dict[object, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_lengths(
        cls, lengths: torch.Tensor, width: int, total: int, host_lengths: np.ndarray | None = None, bucket: int = 1
    ) -> Packing:
        """The packing of sentences of ``lengths`` tokens (int [rows], on the compute device); ``total`` must equal
        ``lengths.sum()``, passed in from the host so that nothing here waits for the device, as may be the same
        lengths (``host_lengths``, for :attr:`tiles`). ``bucket``: the packed order is grown with rows of padding
        (token 0 at position 0, after the last sentence) to a multiple of this many tokens."""
        rows = int(lengths.shape[0])
        device = lengths.device
        lengths = lengths.to(torch.int32)
        cu = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        torch.cumsum(lengths, 0, out=cu[1:])
        # output_size: the result's length is known, so the device is not asked for it (no sync).
        row = torch.repeat_interleave(torch.arange(rows, device=device), lengths.long(), output_size=total)
        grown = -(-total // bucket) * bucket
        positions = torch.zeros(grown, dtype=torch.long, device=device)
        torch.sub(torch.arange(total, device=device), cu[:-1].long()[row], out=positions[:total])
        index = row * width + positions[:total]
        mask = torch.arange(width, device=device) < lengths[:, None]
        tiles = fused.segment_tiles(host_lengths) if host_lengths is not None else ()
        return cls(rows, width, grown, lengths, cu, index, positions, mask, tiles=tiles)

    @property
    def real(self) -> int:
        """Rows of the packed order that hold tokens of a sentence (the rest, up to :attr:`total`, are padding)."""
        return len(self.index) if not self.slotted else self.total

    @classmethod
    def slots(cls, lengths: torch.Tensor, width: int) -> Packing:
        """The layout of :func:`slotted_attention`: every slot of the padded batch, in its order, plus whole rows of
        padding up to a multiple of ``per_group`` rows, so that ``per_group`` consecutive rows form one attention
        row by a view (no gather). ``total`` counts slots; :attr:`index` and :attr:`positions` cover them all;
        :attr:`mask` (real tokens) keeps the batch's own ``[rows, width]``.

        On length-sorted batches padding is a few percent of the slots (the batcher bounds it), which costs less
        than the gathers the packed order needs around each attention.
        """
        rows = int(lengths.shape[0])
        device = lengths.device
        per = max(1, GROUP_TOKENS // width)
        grown = -(-rows // per) * per
        lengths = lengths.to(torch.int32)
        cu = torch.arange(rows + 1, device=device, dtype=torch.int32) * width
        index = torch.arange(grown * width, device=device)
        positions = torch.arange(width, device=device).repeat(grown)
        mask = torch.arange(width, device=device) < lengths[:, None]
        return cls(rows, width, grown * width, lengths, cu, index, positions, mask, slotted=True)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """``[rows, width, ...]`` -> ``[total, ...]``: the real tokens, sentence after sentence (for :meth:`slots`:
        every slot, with rows of zeros at the end)."""
        if self.slotted:
            flat = padded.reshape(self.rows * self.width, *padded.shape[2:])
        else:
            flat = padded.reshape(self.rows * self.width, *padded.shape[2:]).index_select(0, self.index)
        if self.total == len(flat):
            return flat
        return torch.cat([flat, flat.new_zeros((self.total - len(flat), *flat.shape[1:]))])

    def unpack(self, packed: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """``[total, ...]`` -> ``[rows, width, ...]`` with zeros at padding (the inverse of :meth:`pack`);
        ``rows`` (>= :attr:`rows`) adds rows of padding at the end. For :meth:`slots`, a view of the first rows,
        whose padding slots hold whatever the layers computed there (poolings read real tokens only)."""
        rows = self.rows if rows is None else rows
        if self.slotted and rows <= self.total // self.width:
            return packed.view(self.total // self.width, self.width, *packed.shape[1:])[:rows]
        out = packed.new_zeros((rows * self.width, *packed.shape[1:]))
        out.index_copy_(0, self.index, packed[: self.real])
        return out.view(rows, self.width, *packed.shape[1:])

    @property
    def per_group(self) -> int:
        """Sentences side by side in one attention group of :meth:`slots` (``GROUP_TOKENS // width``, >= 1)."""
        return max(1, GROUP_TOKENS // self.width)

    def group_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask of :func:`slotted_attention` in ``dtype`` (a :meth:`slots` layout), [groups, 1, L, L]
        with L = per_group x width: 0 where query and key are in the same sentence and the key is a real token (and
        on the diagonal), -inf elsewhere. Built once per batch (every layer uses it); its rows are 16-aligned in
        memory, as the memory-efficient kernel wants (a view of a wider buffer)."""
        if not self.slotted:
            raise ValueError("group_bias needs a Packing.slots layout")
        if dtype in self._cache:
            return self._cache[dtype]
        per, width = self.per_group, self.width
        groups = -(-self.rows // per)
        length = per * width
        valid = torch.zeros((groups * per, width), dtype=torch.bool, device=self.index.device)
        valid[: self.rows] = self.mask
        slot = torch.arange(length, device=self.index.device) // width
        allowed = (slot[:, None] == slot[None, :])[None] & valid.view(groups, 1, length)
        # A padding query attends to itself: no all-masked row (SDPA would give NaN there).
        allowed |= torch.eye(length, dtype=torch.bool, device=self.index.device)[None]
        shape = (groups, 1, length, -(-length // 16) * 16)
        bias = torch.full(shape, float("-inf"), dtype=dtype, device=self.index.device)[..., :length]
        bias.masked_fill_(allowed[:, None], 0.0)
        self._cache[dtype] = bias
        return bias


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing) -> torch.Tensor:
    """softmax(q k^T / sqrt(head_dim)) v within each sentence, [total, heads, head_dim] like the packed ``q``,
    ``k``, ``v``, by padding for SDPA (any device and dtype)."""

    def pad(t: torch.Tensor) -> torch.Tensor:  # [rows, heads, width, head_dim]
        return packing.unpack(t).transpose(1, 2)

    out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=packing.mask[:, None, None, :])
    return packing.pack(out.transpose(1, 2))


#: Token slots per attention group of :meth:`Packing.slots`: attention kernels work in tiles of 64-128 queries x
#: keys, so a sentence of 15 tokens alone in a row leaves most of each tile, and of the kernel's time, to padding.
GROUP_TOKENS = 128


def slotted_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing) -> torch.Tensor:
    """:func:`padded_attention` on the layout of :meth:`Packing.slots`, ``per_group`` sentences side by side in one
    attention group, each kept to itself by the block-diagonal mask of :meth:`Packing.group_bias`: the groups are
    views, nothing is gathered (SDPA, any device). Real tokens get :func:`padded_attention`'s result; a padding slot
    attends to itself only."""
    if not packing.slotted:
        raise ValueError("slotted_attention needs a Packing.slots layout")
    bias = packing.group_bias(q.dtype)
    groups, length = bias.shape[0], bias.shape[-1]

    def rows(t: torch.Tensor) -> torch.Tensor:  # [groups, heads, length, head_dim], a view
        return t.view(groups, length, *t.shape[1:]).transpose(1, 2)

    out = F.scaled_dot_product_attention(rows(q), rows(k), rows(v), attn_mask=bias)
    return out.transpose(1, 2).reshape(packing.total, *q.shape[1:])


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing) -> torch.Tensor:
    """:func:`padded_attention`'s result on packed real tokens by the Triton kernel
    :func:`~bertflow.encoding.fused.segment_attention`, where it fits and the packing has its :attr:`~Packing.tiles`
    (else :func:`padded_attention`): no padding in any layer, attention included."""
    if packing.slotted:
        raise ValueError("segment_attention needs a packed layout (Packing.from_lengths)")
    if not (packing.tiles and segment_attention_fits(q, packing.width)):
        return padded_attention(q, k, v, packing)
    out = fused.segment_attention(q, k, v, packing.cu_seqlens, packing.positions, packing.tiles)
    if packing.real < packing.total:
        out[packing.real :].zero_()  # the rows of padding at the end, never written by the kernel
    return out


#: How :class:`PackedBert` runs a layer: ``modules``, the model's own modules one by one; ``fused``, one GEMM
#: for Q, K and V and the residual add fused with LayerNorm (:mod:`bertflow.encoding.fused`); ``fused-gelu``, also
#: GELU in the intermediate GEMM's epilogue (its tanh form).
KERNELS = ("modules", "fused", "fused-gelu")

#: The attentions of the unpadded forward by name (benchmarks compare them: docs/performance.md).
ATTENTIONS: dict[str, Attention] = {
    "padded": padded_attention,
    "slotted": slotted_attention,
    "segments": segment_attention,
}
#: Attentions that run on the :meth:`Packing.slots` layout instead of packed real tokens.
SLOTTED = frozenset({"slotted"})


def uses_slots(attention: Attention) -> bool:
    """Whether ``attention`` (one of :data:`ATTENTIONS`) runs on the :meth:`Packing.slots` layout."""
    return any(attention is ATTENTIONS[name] for name in SLOTTED)


#: The attention of the unpadded forward on CUDA where its kernel runs (:func:`~.fused.attention_kernel_fits`;
#: else :data:`CUDA_FALLBACK_ATTENTION`), and whether that forward is the CUDA default
#: (``EncodeSettings.unpadded=None``): chosen by measurement (docs/performance.md, issue 23: on an H200 the
#: grouped attention made BERT-base's forward 1.10x faster than the padded one, varlen 0.94x; with the fused
#: kernels, the slotted layout 1.38x, grouped 1.30x; its Triton kernel instead of SDPA under a mask, 1.12x more
#: for BERT-base and 1.37x for MiniLM-L6; then the packed layout with its own kernel, whose batches need not bound
#: their padding, BERT-base end to end warm 160-169k sentences/s against 136-141k slotted).
CUDA_ATTENTION = "segments"
CUDA_FALLBACK_ATTENTION = "slotted"
UNPADDED_BY_DEFAULT = True
#: How the unpadded layers run on CUDA in half precision where Triton is available (:data:`KERNELS`); elsewhere
#: ``modules``. Chosen by measurement (docs/performance.md, issue 23, fifth call: ``slotted`` + ``fused-gelu`` made
#: BERT-base's forward 1.38x and MiniLM-L6's 1.69x faster than the padded one on an H200; ``grouped`` +
#: ``modules``, the previous default, 1.11x / 1.16x).
CUDA_KERNELS = "fused-gelu"
#: The packed layout of :func:`segment_attention` grows each batch to a multiple of this many tokens, so that its
#: matrix products meet a few shapes again and again: cuBLAS sets up each new shape on the host (0.2 ms median,
#: up to 6 ms, per GEMM shape on an H200 host), and a batch of new text had a new token count every time. Chosen by
#: measurement (docs/performance.md, issue 23: BERT-base first passes 159k / 162k sentences/s with 256, 157k / 149k
#: with 1,024, 156k / 127k with 4,096, 105k / 119k without; at most 255 tokens of padding a batch).
TOKEN_BUCKET = 256


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why :class:`PackedBert` cannot run ``model`` (``None``: it can).

    Only an exact ``transformers`` ``BertModel`` encoder with absolute positions is taken: a subclass or
    another architecture may compute something this module does not reproduce, and must take the padded path.
    """
    try:
        from transformers.models.bert import modeling_bert as mb
    except ImportError:  # pragma: no cover - transformers is a dependency
        return "transformers has no BERT module"
    if type(model) is not mb.BertModel:
        return f"{type(model).__name__} is not a BertModel"
    config = model.config
    if config.is_decoder or getattr(config, "add_cross_attention", False):
        return "a decoder (causal or cross attention)"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position embeddings {config.position_embedding_type!r} (only 'absolute')"
    if type(model.embeddings) is not mb.BertEmbeddings:
        return "custom embeddings"
    for layer in model.encoder.layer:
        parts = (layer, layer.attention, layer.attention.self, layer.attention.output)
        expected = (mb.BertLayer, mb.BertAttention, mb.BertSelfAttention, mb.BertSelfOutput)
        if any(type(p) is not t for p, t in zip(parts, expected, strict=True)):
            return "custom transformer layers"
        if type(layer.intermediate) is not mb.BertIntermediate or type(layer.output) is not mb.BertOutput:
            return "custom feed-forward blocks"
        sa = layer.attention.self
        if abs(sa.scaling - sa.attention_head_size**-0.5) > 1e-12:
            return "a non-standard attention scale"
    return None


class PackedBert:
    """Runs a ``BertModel``'s own modules on packed tokens (no padding anywhere but, optionally, attention); a
    ValueError, saying why, for a model :func:`unsupported_reason` refuses (it must be in eval mode)."""

    def __init__(self, model: torch.nn.Module, kernels: str = "modules") -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"unpadded forward not supported: {reason}")
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
        self.model = model
        self.num_layers = int(model.config.num_hidden_layers)
        self.heads = int(model.config.num_attention_heads)
        #: How each layer runs (:data:`KERNELS`); benchmarks and the runner may change it between batches.
        self.kernels = kernels
        self._qkv: dict[int, tuple[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]]] = {}

    def states(
        self, input_ids: torch.Tensor, packing: Packing, layers: Sequence[int], attention: Attention
    ) -> dict[int, torch.Tensor]:
        """Packed hidden states ``{k: [total, hidden]}`` for each ``hidden_states`` index ``k`` in ``layers`` (0:
        embeddings, L: last layer; layers above the highest are not run), from ``input_ids`` [rows, width] int64
        padded on the model's device, with one of :data:`ATTENTIONS`."""
        x = self.embed(packing.pack(input_ids), packing.positions)
        return self.encode(x, layers, lambda q, k, v: attention(q, k, v, packing))

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The embedding layer's output [total, hidden] for packed token ``ids`` and their ``positions`` in their
        sentences (int64 [total] each): the model's own module on one "row" of all tokens (token types 0, as in
        the padded forward)."""
        return self.model.embeddings(input_ids=ids[None], position_ids=positions[None])[0]

    def encode(
        self, x: torch.Tensor, layers: Sequence[int], attend: Callable[..., torch.Tensor]
    ) -> dict[int, torch.Tensor]:
        """:meth:`states` from the embedding layer's output ``x`` [total, hidden]; ``attend(q, k, v)`` ([total,
        heads, head_dim] each) is the attention within each sentence."""
        wanted = set(layers)
        out = {0: x} if 0 in wanted else {}
        for k, layer in enumerate(self.model.encoder.layer[: max(wanted)], start=1):
            x = self._layer(layer, x, attend)
            if k in wanted:
                out[k] = x
        return out

    def _layer(self, layer: torch.nn.Module, x: torch.Tensor, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        sa = layer.attention.self
        total = x.shape[0]
        shape = (total, self.heads, sa.attention_head_size)
        if self.kernels == "modules":
            a = attend(sa.query(x).view(shape), sa.key(x).view(shape), sa.value(x).view(shape))
            x = layer.attention.output(a.reshape(total, -1), x)  # dense, then LayerNorm(. + x)
            return layer.output(layer.intermediate(x), x)  # dense + GELU, dense, then LayerNorm(. + x)
        # Fused (encoding/fused.py): one QKV GEMM, residual add + LayerNorm in one pass, optionally GELU in the GEMM.
        weight, bias = self._qkv_of(sa)
        q, k, v = F.linear(x, weight, bias).view(total, 3, *shape[1:]).unbind(1)
        a = attend(q, k, v).reshape(total, -1)
        out = layer.attention.output
        x = add_layer_norm(out.dense(a), x, out.LayerNorm)
        inter = layer.intermediate
        h = linear_gelu(x, inter.dense) if self.kernels == "fused-gelu" else inter.intermediate_act_fn(inter.dense(x))
        return add_layer_norm(layer.output.dense(h), x, layer.output.LayerNorm)

    def _qkv_of(self, sa: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's concatenated QKV projection, made once (remade if a weight was replaced or changed)."""
        params = (sa.query.weight, sa.key.weight, sa.value.weight, sa.query.bias, sa.key.bias, sa.value.bias)
        key = tuple(p.data_ptr() for p in params) + tuple(p._version for p in params)
        cached = self._qkv.get(id(sa))
        if cached is None or cached[0] != key:
            cached = (key, qkv_weights(sa))
            self._qkv[id(sa)] = cached
        return cached[1]


def max_cosine_deviation(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``1 - cos(a_i, b_i)`` over rows of two [n, D] tensors (computed in float32; syncs)."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=1, eps=1e-12)
    return float((1 - cos).max()) if len(cos) else 0.0
