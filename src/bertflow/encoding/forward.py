"""The model side of encoding: forward passes over prepared batches, pooling on the device, one copy per chunk.

A :class:`ModelRunner` computes any number of poolings from ONE forward pass (:class:`PoolingPlan`), each in
float32, side by side; a chunk's vectors are put back in input order on the device, optionally transformed there
(e.g. calibrated: :data:`DeviceTransform`), checked for NaN/Inf and overflow without a sync, and copied to the host
in one transfer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..typing import DeviceTransform
from ..validation import OUTPUT_LIMIT, check_finite, raise_calibrated
from .batching import HostBatch, PreparedChunk
from .device import attention_backends, transformers_major
from .fused import attention_kernel_fits, triton_available
from .graphs import GraphForward, layout, supports
from .packed import (
    ATTENTIONS,
    CUDA_ATTENTION,
    CUDA_FALLBACK_ATTENTION,
    CUDA_KERNELS,
    TOKEN_BUCKET,
    UNPADDED_BY_DEFAULT,
    Attention,
    PackedBert,
    Packing,
    max_cosine_deviation,
    padded_attention,
    unsupported_reason,
    uses_slots,
)
from .pooling import Pooling, Weighting
from .settings import EncodeSettings
from .token_stats import TokenStatistics

logger = logging.getLogger(__name__)

#: Largest 1 - cos between the unpadded and the padded forward's pooled vectors that the automatic unpadded path
#: accepts on its first batch (bf16 rounding moves them by ~1e-5; a wrong computation by far more).
UNPADDED_TOLERANCE = 1e-3


@dataclass(frozen=True)
class PoolingPlan:
    """The poolings one forward pass computes, and what that pass must keep of the model's layers."""

    poolings: tuple[Pooling, ...]
    layers: tuple[int, ...]  # hidden-state indices read (num_layers: the last layer's output)
    hidden_states: bool  # ask the model for every layer (its layer list was not found for hooks)
    #: per weighting spec, the weight of every token id (float32 [V], on the device), for the weighted poolings
    tables: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Pending:
    """A chunk launched on the device (CUDA: done once ``event`` completes), its vectors still where they were
    computed."""

    offset: int
    result: torch.Tensor  # float32 [n, D] on the model's device
    checks: torch.Tensor  # float32 [3]: pooled value non-finite (1/0), transformed value out of bounds (1/0), bound
    event: Any = None


class StopForward(Exception):
    """Raised by a capture hook once the highest layer a pooling reads has been seen: the rest is skipped."""


def find_layer_list(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList | None:
    """The model's list of transformer layers (a ModuleList of ``num_layers`` modules of one class), if any."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers > 0:
            if len({type(m) for m in module}) == 1:
                return module
    return None


@contextlib.contextmanager
def capture_layer_inputs(
    layers: torch.nn.ModuleList, needed: Sequence[int], num_layers: int, store: dict[int, torch.Tensor]
) -> Iterator[None]:
    """Keep ``hidden_states[k]`` (the input of layer ``k``) in ``store`` for each needed ``k < L`` during one forward.

    If no needed index is ``L`` (the last layer's output), the forward is stopped with :class:`StopForward`
    right after the highest needed input is seen: the layers above it are never run.
    """
    stop_at = max(needed) if max(needed) < num_layers else None

    def hook_for(k: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            store[k] = args[0] if args else kwargs["hidden_states"]
            if k == stop_at:
                raise StopForward

        return hook

    handles = [layers[k].register_forward_pre_hook(hook_for(k), with_kwargs=True) for k in needed if k < num_layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class ModelRunner:
    """Runs a frozen model (already on ``device`` in its compute dtype, in eval mode; ``model_id`` names it in
    messages) on prepared batches and pools on its device."""

    def __init__(self, model: torch.nn.Module, device: torch.device, model_id: str) -> None:
        self.model, self.device, self.model_id = model, device, model_id
        self.num_layers = int(model.config.num_hidden_layers)
        self.dim = int(model.config.hidden_size)
        # Layer-list poolings read the inputs of the layers they need through hooks (and stop the forward
        # after the highest one); every layer is requested from the model only if its layer list is not found.
        self.layer_list = find_layer_list(model, self.num_layers)
        # A prepared 4-D boolean mask goes straight to SDPA in transformers >= 5; a 2-D mask would make the
        # mask builder check on the host whether the batch has padding at all (one device sync per batch).
        self.mask_4d = transformers_major() >= 5 and getattr(model.config, "_attn_implementation", "") == "sdpa"
        # The unpadded forward (encoding/packed.py): on CUDA in half precision, for a supported model, when asked
        # (or by default if UNPADDED_BY_DEFAULT), and automatically only once its first batch has matched the padded
        # forward (_forward_packed); the padded path is the reference.
        self.unpadded_refused = unsupported_reason(model)
        self.packed = PackedBert(model) if self.unpadded_refused is None else None
        self.packed_verified = False
        dtype = next(model.parameters()).dtype
        self.half_cuda = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
        if self.packed is not None and self.half_cuda and triton_available(device):
            self.packed.kernels = CUDA_KERNELS  # fused layer steps (encoding/fused.py); benchmarks swap it
        head_dim = self.dim // int(getattr(model.config, "num_attention_heads", 1) or 1)
        kernel = attention_kernel_fits(device, dtype, head_dim)
        # benchmarks swap these two to compare kernels
        self.cuda_attention: Attention = ATTENTIONS[CUDA_ATTENTION if kernel else CUDA_FALLBACK_ATTENTION]
        self.token_bucket = TOKEN_BUCKET
        # The packed forward replayed from CUDA graphs (encoding/graphs.py), where its attention kernel runs; like the
        # unpadded forward, checked once against the padded one on its first batch when automatic.
        usable = self.packed is not None and self.half_cuda and kernel and self.packed.kernels == CUDA_KERNELS
        self.graphs = GraphForward(self.packed, device) if usable and self.packed is not None else None
        self.graphs_verified = False
        self._copy_stream: Any = None  # CUDA: where finish() copies results to the host

    def plan(
        self,
        poolings: Sequence[str | Sequence[int] | Pooling],
        token_statistics: TokenStatistics | None = None,
    ) -> PoolingPlan:
        """Check ``poolings`` (specs or :class:`Pooling`) against this model and plan their pass; each weighting's
        per-token weights come from ``token_statistics`` once here and stay on the device. An InputError for an
        invalid pooling, ``pooler`` without a pooler head, or a weighted pooling without token statistics."""
        parsed = self.check(poolings)
        tables: dict[str, torch.Tensor] = {}
        for w in {p.weighting.spec: p.weighting for p in parsed if p.weighting.weighted}.values():
            tables[w.spec] = self._weight_table(w, token_statistics, next(p for p in parsed if p.weighting == w))
        # A pooling that reads other outputs than layers (the pooler) needs the full forward: the last layer.
        layers = {i for p in parsed for i in p.layers} | {self.num_layers for p in parsed if p.inputs}
        hidden = any(i != self.num_layers for i in layers)
        return PoolingPlan(tuple(parsed), tuple(sorted(layers)), hidden and self.layer_list is None, tables)

    def check(self, poolings: Sequence[str | Sequence[int] | Pooling]) -> list[Pooling]:
        """``poolings`` parsed against this model, each once (first-seen order); an InputError for an invalid
        pooling or ``pooler`` on a model without a pooler head."""
        if isinstance(poolings, (str, Pooling)):
            raise InputError("poolings must be a list of poolings, e.g. ['mean', 'cls']")
        parsed = [Pooling.parse(p, self.num_layers) for p in poolings]
        parsed = list({p.key: p for p in parsed}.values())
        if not parsed:
            raise InputError("give at least one pooling")
        for p in parsed:
            if "pooler_output" in p.inputs and getattr(self.model, "pooler", None) is None:
                raise InputError(f"pooling {p.name!r} needs a pooler head, and {self.model_id} has none")
        return parsed

    def _weight_table(self, weighting: Weighting, stats: TokenStatistics | None, pooling: Pooling) -> torch.Tensor:
        """``weighting``'s per-token weights from ``stats`` as a float32 [V] tensor on the device."""
        if stats is None:
            raise InputError(
                f"pooling {pooling.name!r} weights tokens by their frequency, and the encoder has no token "
                "statistics: fit the model (Embedder.fit counts the fitting sentences), or set "
                "encoder.token_statistics = encoder.count_tokens(corpus)"
            )
        return torch.from_numpy(weighting.table(stats)).to(self.device)

    def packed_attention(self, unpadded: bool | None) -> Attention | None:
        """The attention of the unpadded forward for the ``unpadded`` setting (``EncodeSettings.unpadded`` says when),
        or None: use the padded forward. An InputError for ``True`` on a model the unpadded forward cannot run."""
        if unpadded is None:
            usable = UNPADDED_BY_DEFAULT and self.half_cuda and self.packed is not None
            return self.cuda_attention if usable and self.unpadded_refused is None else None
        if not unpadded:
            return None
        if self.packed is None:
            raise InputError(f"{self.model_id}: unpadded encoding is not available: {self.unpadded_refused}")
        return self.cuda_attention if self.half_cuda else padded_attention

    def padding_free(self, unpadded: bool | None) -> bool:
        """Whether the forward for the ``unpadded`` setting runs every layer on real tokens only (the packed layout:
        a batch's padding costs nothing, so the batcher need not bound it)."""
        attention = self.packed_attention(unpadded)
        return attention is not None and not uses_slots(attention)

    def graphs_on(self, settings: EncodeSettings) -> bool:
        """Whether batches run the graphed forward (:mod:`~bertflow.encoding.graphs`) under ``settings``."""
        if self.graphs is None or not settings.uses_graphs(self.dim):
            return False
        return self.packed_attention(settings.unpadded) is ATTENTIONS["segments"]

    def graph_layout(self, settings: EncodeSettings, pad_id: int) -> Callable[..., torch.Tensor | None] | None:
        """The :func:`~bertflow.encoding.graphs.layout` that chunks' batches need for the graphed forward under
        ``settings`` (``None``: it does not run)."""
        return functools.partial(layout, pad_id=pad_id, pinned=True) if self.graphs_on(settings) else None

    @torch.inference_mode()
    def forward(
        self, batch: HostBatch, plan: PoolingPlan, cudnn_attention: bool = False, unpadded: bool | None = False
    ) -> torch.Tensor:
        """Pooled float32 vectors [rows, P x D] of one batch (the plan's poolings side by side), on the device.

        ``unpadded``: run the model on real tokens only (:meth:`packed_attention` says when).
        """
        attention = self.packed_attention(unpadded)
        if attention is not None and batch.graph_input is not None and self._graphable(plan, attention):
            return self._forward_graph(batch, plan, check=unpadded is None, cudnn=cudnn_attention)
        if attention is not None:
            return self._forward_packed(batch, plan, attention, check=unpadded is None, cudnn=cudnn_attention)
        rows, width = batch.rows, batch.width
        buf = batch.padded().to(self.device, non_blocking=True)
        # int32 travels (half the bytes); embedding lookups and position-id arithmetic get int64 as usual.
        input_ids = buf[: rows * width].view(rows, width).long()
        if batch.uniform:
            attention, mask = None, None  # no padding: SDPA may take the flash kernel, no mask to build
        else:
            lengths = buf[rows * width :]
            mask = torch.arange(width, device=self.device) < lengths[:, None]
            attention = mask[:, None, None, :] if self.mask_4d else mask.long()
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention}
        if plan.hidden_states:
            kwargs["output_hidden_states"] = True
        captured: dict[int, torch.Tensor] = {}
        try:
            with attention_backends(self.device, cudnn_attention):
                if self.layer_list is not None and not plan.hidden_states:
                    with capture_layer_inputs(self.layer_list, plan.layers, self.num_layers, captured):
                        outputs: Any = self.model(**kwargs)
                else:
                    outputs = self.model(**kwargs)
        except StopForward:
            outputs = None
        except Exception:
            if attention is None or attention.dim() != 4:
                raise
            # A model whose mask code does not take a prepared 4-D mask: use 2-D masks from now on.
            logger.info("%s: prepared 4-D attention masks refused; using 2-D masks", self.model_id)
            self.mask_4d = False
            return self.forward(batch, plan, cudnn_attention)
        if mask is None:
            mask = torch.ones((rows, width), dtype=torch.bool, device=self.device)
        states = self.collect(plan, outputs, captured)
        weights = {spec: table[input_ids] for spec, table in plan.tables.items()}  # [rows, width] each
        pooled = [p.pool(states, mask, weights.get(p.weighting.spec)) for p in plan.poolings]
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)

    def collect(
        self, plan: PoolingPlan, outputs: Any, captured: dict[int, torch.Tensor]
    ) -> dict[int | str, torch.Tensor]:
        """Every layer (and named output) the plan's poolings read, each once, in float32 (a bf16 sum over tokens
        would round every partial sum to 8 bits): ``{index: [B, T, D], "pooler_output": [B, D]}``."""
        states: dict[int | str, torch.Tensor] = {}
        hidden = getattr(outputs, "hidden_states", None)
        for i in plan.layers:
            if i == self.num_layers:
                states[i] = outputs.last_hidden_state.float()
            else:
                states[i] = (hidden[i] if hidden is not None else captured[i]).float()
        if any("pooler_output" in p.inputs for p in plan.poolings):
            pooled = getattr(outputs, "pooler_output", None)
            if pooled is None:
                raise InputError("pooling 'pooler' needs a model with a pooler head; this model has none")
            states["pooler_output"] = pooled.float()
        return states

    def _forward_packed(
        self, batch: HostBatch, plan: PoolingPlan, attention: Attention, check: bool, cudnn: bool
    ) -> torch.Tensor:
        """:meth:`forward` on real tokens only; the pooled layers are scattered back to [rows, width, D]."""
        assert self.packed is not None
        rows, width = batch.rows, batch.width
        host_buffer = batch.padded()
        buf = host_buffer.to(self.device, non_blocking=True)
        input_ids = buf[: rows * width].view(rows, width).long()
        # The lengths are read from the host copy of the buffer: the packed size is known without a device sync.
        if batch.uniform:
            lengths, host = buf.new_full((rows,), width), np.full(rows, width)
        else:
            lengths, host = buf[rows * width :], host_buffer[rows * width :].numpy()
        if uses_slots(attention):
            packing = Packing.slots(lengths, width)
        else:
            bucket = self.token_bucket if attention is ATTENTIONS["segments"] else 1
            packing = Packing.from_lengths(lengths, width, int(host.sum()), host, bucket)
        with attention_backends(self.device, cudnn):  # SDPA inside the slotted and padded attentions
            states = self.packed.states(input_ids, packing, plan.layers, attention)
        captured = {k: packing.unpack(v) for k, v in states.items()}
        last = captured.get(self.num_layers)
        pooler = last is not None and any("pooler_output" in p.inputs for p in plan.poolings)
        outputs = SimpleNamespace(
            last_hidden_state=last, pooler_output=self.model.pooler(last) if pooler else None, hidden_states=None
        )
        pooled_states = self.collect(plan, outputs, captured)
        weights = {spec: table[input_ids] for spec, table in plan.tables.items()}  # [rows, width] each
        pooled = [p.pool(pooled_states, packing.mask, weights.get(p.weighting.spec)) for p in plan.poolings]
        result = pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)
        if check and not self.packed_verified:
            # Once per runner, the automatic path proves itself on real input against the padded forward.
            deviation, reference = self._against_padded(batch, plan, cudnn, result)
            self.packed_verified = True
            if not deviation <= UNPADDED_TOLERANCE:
                self.unpadded_refused = f"its first batch deviated from the padded forward by {deviation:.2e}"
                logger.warning("%s: unpadded forward off, %s", self.model_id, self.unpadded_refused)
                return reference
        return result

    def _against_padded(
        self, batch: HostBatch, plan: PoolingPlan, cudnn: bool, result: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        """The padded forward's vectors of ``batch`` (the reference) and the largest 1 - cos of ``result`` from them
        (one sync)."""
        reference = self.forward(batch, plan, cudnn, unpadded=False)
        return max_cosine_deviation(result, reference), reference

    def _graphable(self, plan: PoolingPlan, attention: Attention) -> bool:
        return (
            self.graphs is not None
            and attention is ATTENTIONS["segments"]
            and not plan.hidden_states
            and supports(plan.poolings)
        )

    def _forward_graph(self, batch: HostBatch, plan: PoolingPlan, check: bool, cudnn: bool) -> torch.Tensor:
        """:meth:`forward` by the packed forward's CUDA graph for the batch's layout."""
        assert self.graphs is not None and batch.graph_input is not None
        x = batch.graph_input.to(self.device, non_blocking=True)
        result = self.graphs(x, plan.poolings, plan.layers, plan.tables)[: batch.rows]
        if check and not self.graphs_verified:
            # Once per runner, as the automatic unpadded forward.
            deviation, reference = self._against_padded(batch, plan, cudnn, result)
            self.graphs_verified = True
            if not deviation <= UNPADDED_TOLERANCE:
                self.graphs = None  # the eager packed forward then checks itself on the next batch
                logger.warning("%s: graphed forward off, its first batch deviated by %.2e", self.model_id, deviation)
                return reference
            self.packed_verified = True  # the packed forward, replayed, matched the padded one
        return result

    @torch.inference_mode()
    def launch(
        self,
        chunk: PreparedChunk,
        plan: PoolingPlan,
        transform: DeviceTransform | None = None,
        on_batch: Callable[[int], None] | None = None,
        cudnn_attention: bool = False,
        unpadded: bool | None = False,
    ) -> Pending:
        """Queue every batch of a chunk and the checks of its result (:meth:`finish` copies it to the host); waits
        for nothing on CUDA.
        ``on_batch(rows)`` is called after each batch is queued (means "done" only on CPU, without a sync);
        ``cudnn_attention``: :func:`~.device.attention_backends`; ``unpadded``: :meth:`packed_attention`."""
        out = torch.empty((chunk.n, self.dim * len(plan.poolings)), dtype=torch.float32, device=self.device)
        for batch in chunk.batches:
            out[batch.start : batch.start + batch.rows] = self.forward(batch, plan, cudnn_attention, unpadded)
            if on_batch is not None:
                on_batch(batch.rows)
        # Back to input order on the device, then one copy for the whole chunk.
        result = out.index_select(0, chunk.inverse.to(self.device, non_blocking=True))
        # Two flags, so that an overflow in the transform is not blamed on the model, and the transform's bound
        # (validation.output_limit: NaN, Inf and implausibly huge values are all refused), on the device: no sync.
        pooled_bad = out_bad = ~torch.isfinite(result).all()
        limit = torch.full((), float("inf"), device=self.device)
        if transform is not None:
            limit = OUTPUT_LIMIT * result.abs().amax().clamp_min(1.0)
            result = transform(result).float()
            out_bad = ~(result.abs() <= limit).all()  # NaN compares false: refused too
        checks = torch.stack([pooled_bad.float(), out_bad.float(), limit.float()])
        if self.device.type != "cuda":
            return Pending(chunk.offset, result, checks)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return Pending(chunk.offset, result, checks, event)

    def finish(self, pending: Pending, out: np.ndarray | None = None) -> np.ndarray:
        """Wait for a launched chunk and return its vectors (float32 [n, D]): written into ``out`` (a C-contiguous
        float32 array of that shape, e.g. rows of the caller's result) if given, else a new array (on CPU, the
        result itself)."""
        result, checks = pending.result, pending.checks
        if pending.event is not None:
            # On a stream of its own, once the chunk is done, while the next one computes; straight into pageable
            # memory. A pinned buffer per chunk had to be page-locked whenever a larger chunk came (0.5 ms per MB on
            # an H200 host), and page-locking waits for the device: the launch of the next chunk waited with it.
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(self.device)
            self._copy_stream.wait_event(pending.event)
            with torch.cuda.stream(self._copy_stream):
                checks = checks.cpu()
                host = torch.empty(result.shape, dtype=torch.float32) if out is None else torch.from_numpy(out)
                host.copy_(result)  # waits for this stream only
            values = host.numpy()
        elif out is not None:
            out[...] = result.numpy()
            values = out
        else:
            values = result.numpy()
        pooled_bad, out_bad, limit = (float(v) for v in checks)
        if pooled_bad:
            check_finite(values, what=f"embeddings from {self.model_id}", first_row=pending.offset)
        if out_bad:
            raise_calibrated(
                values,
                limit,
                what="the transform (calibrator)",
                first_row=pending.offset,
                source=f"from {self.model_id} ",
            )
        return values
