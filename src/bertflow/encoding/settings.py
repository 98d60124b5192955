"""EncodeSettings: the throughput knobs of :class:`bertflow.encoding.encoder.SentenceEncoder`.

None of them changes the vectors (up to floating-point summation order); they decide how sentences are cut into
chunks and forward batches. ``docs/performance.md`` says what each one buys and how the defaults were measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

#: Default token budget per forward pass (padded tokens: rows x width). A GPU needs large batches to keep its
#: matrix units busy; on a CPU larger batches only add memory traffic (docs/performance.md). The CUDA budget is for
#: a model of :data:`FLOOR_HIDDEN` width; a narrower one gets :func:`narrow_factor` times as much, for the reason
#: given at :data:`DEFAULT_MIN_TOKENS` (MiniLM-L6: 262,144).
DEFAULT_MAX_TOKENS = {"cuda": 65536, "cpu": 4096}
#: Default sentences per chunk (the sorting window). A GPU starts with a small chunk so that it gets work
#: after a few milliseconds of tokenisation, then doubles it up to the maximum. On CUDA 16,384 encoded 200,000
#: sentences 1.07-1.37x as fast as 65,536 (chunks tokenised while the GPU runs the previous one keep it fed), and
#: 8,192 was no faster (docs/performance.md, seventeenth pass).
DEFAULT_CHUNK = {"cuda": 16384, "cpu": 16384}
FIRST_CUDA_CHUNK = 4096
#: A batch is cut where the token count changes if the run of equal lengths already fills this share of the
#: batch: such a batch needs no padding mask.
UNIFORM_FILL = 0.5
#: A batch takes no sentence shorter than this share of its width (its longest sentence), where the forward pays
#: for padding (on the unpadded packed forward padding costs no layer anything: no limit there) ...
MIN_LENGTH_RATIO = 0.9
#: ... unless the batch would then be smaller than this many padded tokens: a forward pass costs milliseconds of
#: host time to launch whatever its size, while on a CPU padding is paid in full. The CUDA floor is for a model of
#: :data:`FLOOR_HIDDEN` width; a narrower one gets :func:`narrow_factor` (``(FLOOR_HIDDEN / hidden)^2``, at most 4)
#: times as much, since a token's work per layer grows with the square of the width and the launch cost does not
#: (docs/performance.md).
DEFAULT_MIN_TOKENS = {"cuda": 32768, "cpu": 0}
FLOOR_HIDDEN = 768
#: ``warm_up=None``: warm a CUDA encoder up when it is loaded (:mod:`bertflow.encoding.warmup`); off, as the load
#: grew by more than the first encode shrank (docs/performance.md).
WARM_UP_BY_DEFAULT = False
#: ``graphs=None``: models up to this wide replay their unpadded forward from CUDA graphs (0: none). A narrow model
#: is bound by the host's launches, which graphs remove; a wide one by the device, where a bucket's padding tokens
#: cost more than the launches (docs/performance.md).
GRAPHS_MAX_HIDDEN = 512
#: Real tokens per batch of the graphed forward (a token bucket: the full batches of any text share one graph, and
#: a chunk's last batch takes a smaller power-of-two bucket).
DEFAULT_GRAPH_TOKENS = 65536


#: The least value of each integer field of :class:`EncodeSettings` (``None`` always allowed: the default).
_INT_MINIMUM = {
    "max_tokens": 1,
    "chunk_size": 1,
    "first_chunk": 1,
    "tokenize_workers": 0,
    "tokenize_processes": 0,
    "min_tokens": 0,
}


def device_kind(device_type: str) -> str:
    """The key of the default tables for a torch device type: ``"cuda"`` or ``"cpu"`` (MPS counts as CPU)."""
    return "cuda" if device_type == "cuda" else "cpu"


#: The most :func:`narrow_factor` gives: MiniLM-L6's (hidden 384), the narrowest width measured. An even narrower
#: model keeps MiniLM-L6's batch sizes rather than an extrapolation (hidden 128 would get 36x, gigabytes a batch).
NARROW_FACTOR_MAX = 4.0


def narrow_factor(device_type: str, hidden: int | None) -> float:
    """How many times the CUDA default batch sizes grow for a model ``hidden`` wide: ``(FLOOR_HIDDEN / hidden)^2``
    below :data:`FLOOR_HIDDEN`, at most :data:`NARROW_FACTOR_MAX`; else (and off CUDA, or ``hidden=None``) 1."""
    if device_kind(device_type) != "cuda" or hidden is None or hidden >= FLOOR_HIDDEN:
        return 1.0
    return min(NARROW_FACTOR_MAX, (FLOOR_HIDDEN / hidden) ** 2)


@dataclass(frozen=True)
class EncodeSettings:
    """Throughput knobs of SentenceEncoder (none changes the vectors). ``None`` = the device's default.

    - ``max_tokens``: padded tokens per forward batch (rows x width; real tokens with ``graphs``); ``None``:
      :meth:`token_budget`.
    - ``chunk_size``: sentences tokenised and sorted together by length, every chunk; ``None``: 16,384 on CPU, on
      CUDA ``first_chunk`` first, doubling up to 16,384.
    - ``tokenize_workers``: threads that prepare chunks while the model runs (0: the calling thread); ``None``: two
      with tokenisation processes, else one (docs/performance.md).
    - ``tokenize_processes``: worker processes that tokenise for those threads (started at the first ``encode`` of
      more than one chunk, kept until ``close()``); ``None``: :func:`bertflow.encoding.tokenizer_pool.auto_processes`.
    - ``uniform_fill``, ``min_length_ratio``: how batches are cut (:func:`bertflow.encoding.batching.plan_batches`;
      ``min_length_ratio=None``: :meth:`length_ratio`); ``min_tokens``: padded tokens below which a batch is filled
      up anyway (``None``: :meth:`min_batch_tokens`).
    - ``cudnn_attention``: let torch pick cuDNN attention on CUDA (off by default: it plans every new shape).
    - ``unpadded``: run the model on real tokens only (:mod:`bertflow.encoding.packed`); ``None``: on CUDA in half
      precision for a BERT model whose first batch matches the padded forward; ``True``: for any BERT model (off
      CUDA with a slower attention that pads; other models are an error); ``False``: never.
    - ``graphs``: replay the unpadded forward from CUDA graphs, one per token bucket (:mod:`bertflow.encoding.graphs`;
      where the unpadded forward runs with its attention kernel); ``None``: :meth:`uses_graphs`'s default.
    - ``warm_up``: pay the one-time costs (:mod:`bertflow.encoding.warmup`) when the encoder is loaded instead of in
      the first ``encode``; ``None``: :data:`WARM_UP_BY_DEFAULT` on CUDA.
    - ``prefault``: ``encode`` of more than ``first_chunk`` sentences writes its result's pages on a thread ahead of
      the chunks (:mod:`bertflow.encoding.prefault`), and on CUDA ``iter_encode`` each fresh chunk array's while the
      chunk computes, so that the copies from the device do not take their page faults on the calling thread;
      ``None``: on CUDA (where those faults held up the pipeline: docs/performance.md, fifteenth pass).

    Example:
        >>> import dataclasses
        >>> dataclasses.replace(EncodeSettings(), uniform_fill=0.7).uniform_fill
        0.7
    """

    max_tokens: int | None = None
    chunk_size: int | None = None
    tokenize_workers: int | None = None
    tokenize_processes: int | None = None
    uniform_fill: float = UNIFORM_FILL
    min_length_ratio: float | None = None
    min_tokens: int | None = None
    first_chunk: int = FIRST_CUDA_CHUNK
    cudnn_attention: bool = False
    unpadded: bool | None = None
    graphs: bool | None = None
    warm_up: bool | None = None
    prefault: bool | None = None

    def __post_init__(self) -> None:
        for name, low in _INT_MINIMUM.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise InputError(f"{name} must be {'a positive integer' if low else '0 or more'}, got {value!r}")
        for name in ("uniform_fill", "min_length_ratio"):
            value = getattr(self, name)
            if value is None and name == "min_length_ratio":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InputError(f"{name} must be a number of 0 or more, got {value!r}")
        if self.min_length_ratio is not None and self.min_length_ratio > 1:
            raise InputError(f"min_length_ratio must be at most 1, got {self.min_length_ratio!r}")
        if not isinstance(self.cudnn_attention, bool):
            raise InputError(f"cudnn_attention must be True or False, got {self.cudnn_attention!r}")
        for name in ("unpadded", "graphs", "warm_up", "prefault"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise InputError(f"{name} must be None, True or False, got {value!r}")

    def token_budget(self, device_type: str, hidden: int | None = None, graphs: bool = False) -> int:
        """Padded tokens per forward pass on a device of this type: ``max_tokens``, else the default (4,096 on CPU;
        on CUDA 65,536, times :func:`narrow_factor` for a model ``hidden`` wide); with ``graphs`` (the graphed
        forward runs) real tokens, by default :data:`DEFAULT_GRAPH_TOKENS`."""
        if self.max_tokens:
            return self.max_tokens
        if graphs:
            return DEFAULT_GRAPH_TOKENS
        return int(DEFAULT_MAX_TOKENS[device_kind(device_type)] * narrow_factor(device_type, hidden))

    def length_ratio(self, padding_free: bool) -> float:
        """``min_length_ratio``, else :data:`MIN_LENGTH_RATIO`, or 0 (no limit) for a forward that runs on real
        tokens only (``padding_free``: the packed layout), where the padding of a batch costs nothing."""
        if self.min_length_ratio is not None:
            return self.min_length_ratio
        return 0.0 if padding_free else MIN_LENGTH_RATIO

    def min_batch_tokens(self, device_type: str, hidden: int | None = None) -> int:
        """``min_tokens`` or the device's default; on CUDA times :func:`narrow_factor` for a model ``hidden`` wide, up
        to :meth:`token_budget`."""
        if self.min_tokens is not None:
            return self.min_tokens
        floor = int(DEFAULT_MIN_TOKENS[device_kind(device_type)] * narrow_factor(device_type, hidden))
        return min(floor, self.token_budget(device_type, hidden))

    def uses_graphs(self, hidden: int) -> bool:
        """Whether the unpadded forward of a model ``hidden`` wide replays CUDA graphs (``graphs``; ``None``: for
        models up to :data:`GRAPHS_MAX_HIDDEN` wide)."""
        return self.graphs if self.graphs is not None else hidden <= GRAPHS_MAX_HIDDEN

    def warms_up(self, device_type: str) -> bool:
        """Whether an encoder on this device type warms up when it is loaded (``warm_up``)."""
        return self.warm_up if self.warm_up is not None else WARM_UP_BY_DEFAULT and device_type == "cuda"

    def prefaults(self, device_type: str) -> bool:
        """Whether ``encode`` here writes its result's pages on a thread ahead of its chunks (``prefault``)."""
        return self.prefault if self.prefault is not None else device_type == "cuda"
