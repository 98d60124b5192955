"""sentence-transformers' ``encode`` / ``similarity`` conventions for :class:`~bertflow.embedder.Embedder`: the
keywords of ``SentenceTransformer.encode`` checked and applied to calibrated embeddings, and the cosine of two
embedding inputs, so code (and MTEB) written for a ``SentenceTransformer`` runs unchanged on an Embedder."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .errors import InputError
from .linalg import unit_rows

#: ``Embedder.encode(precision=...)`` values: sentence-transformers' (``quantize_embeddings``).
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def check_encode_keywords(
    unknown: dict[str, Any],
    *,
    prompt: str | None,
    prompt_name: str | None,
    device: str | torch.device | list[str | torch.device] | None,
    encoder_device: torch.device,
    precision: str,
    output_value: str | None = "sentence_embedding",
) -> None:
    """Refuse, before any encoding, what ``Embedder.encode`` cannot honour: TypeError naming the ``unknown``
    keywords; InputError for a prompt, a single ``device`` other than ``encoder_device``, an empty or unparsable
    device list, a precision not in :data:`PRECISIONS`, an ``output_value`` other than ``"sentence_embedding"``."""
    if unknown:
        raise TypeError(
            f"Embedder.encode() got unexpected keyword argument(s) {', '.join(map(repr, sorted(unknown)))}; it "
            "takes batch_size, show_progress_bar, convert_to_numpy, convert_to_tensor, normalize_embeddings, "
            "precision, device, truncate_dim (and prompt=None, prompt_name=None, output_value='sentence_embedding')"
        )
    if output_value != "sentence_embedding":
        raise InputError(
            f"Embedder.encode() gives calibrated sentence embeddings only (output_value='sentence_embedding'), not "
            f"{output_value!r}: the calibrator maps pooled sentence vectors, not token embeddings"
        )
    if isinstance(device, (list, tuple)):
        if not device:
            raise InputError("device=[] names no device: give one device, or a list of them (one process each)")
        for d in device:
            try:
                torch.device(d)
            except (RuntimeError, TypeError):
                raise InputError(f"device list entry {d!r} is not a torch device ('cpu', 'cuda:0'...)") from None
        device = None  # a list starts one process per entry: any device is fine
    if prompt is not None or prompt_name is not None:
        raise InputError(
            "Embedder.encode() takes no prompt: the calibrator was fitted on sentences without one, so a prompt "
            "would change what it is applied to; put the prompt in the sentences for both fit and encode instead"
        )
    if device is not None and torch.device(device) != encoder_device:
        raise InputError(
            f"this Embedder encodes on {encoder_device}, not {device}: the device is chosen when the "
            f"encoder is built (SentenceEncoder(..., device={str(device)!r}), or Embedder.load(..., device=...))"
        )
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def check_truncate_dim(truncate_dim: int | None, dim: int) -> None:
    """Refuse (InputError) a ``truncate_dim`` that is not ``None`` or an int in [1, ``dim``], the calibrated
    dimension."""
    if truncate_dim is None:
        return
    is_int = isinstance(truncate_dim, (int, np.integer)) and not isinstance(truncate_dim, bool)
    if not is_int or not 1 <= truncate_dim <= dim:
        raise InputError(
            f"truncate_dim must be None or an integer in [1, {dim}] (the output dimension), got {truncate_dim!r}"
        )


def convert_embeddings(
    out: np.ndarray,
    *,
    single: bool,
    device: torch.device,
    truncate_dim: int | None = None,
    normalize_embeddings: bool = False,
    precision: str = "float32",
    convert_to_tensor: bool = False,
    convert_to_numpy: bool = True,
) -> Any:
    """``out`` (float32 [N, D'], or [D'] for one sentence when ``single``) as sentence-transformers' ``encode``
    returns it with these keywords: the first ``truncate_dim`` columns, unit rows (after truncation, as
    sentence-transformers), quantised (``quantize_embeddings``, ranges from ``out`` itself), and an array, one
    tensor on ``device``, or (``convert_to_numpy=False``) a list of N tensors [D']. InputError: a precision other
    than float32 without sentence-transformers installed."""
    if truncate_dim is not None:
        out = np.ascontiguousarray(out[..., :truncate_dim])
    if normalize_embeddings:
        out = unit_rows(np.atleast_2d(out)).astype(np.float32).reshape(out.shape)
    if precision != "float32":
        try:  # sentence-transformers >= 6; 5 has it in .quantization (a deprecated alias in 6)
            from sentence_transformers.util.quantization import quantize_embeddings
        except ImportError:
            try:
                from sentence_transformers.quantization import quantize_embeddings
            except ImportError:
                raise InputError(
                    f"precision={precision!r} needs sentence-transformers: pip install 'bertflow[st]'"
                ) from None
        if precision in ("int8", "uint8") and np.atleast_2d(out).shape[0] < 2:
            raise InputError(
                f"precision={precision!r} takes its value ranges from the embeddings encoded together, so it needs "
                "at least 2 sentences in one call; encode them together, or use 'binary' / 'ubinary'"
            )
        out = np.asarray(quantize_embeddings(np.atleast_2d(out), precision=precision))
        out = out[0] if single else out
    if convert_to_tensor:
        return torch.from_numpy(out).to(device)
    if not convert_to_numpy:
        tensor = torch.from_numpy(out).to(device)
        return tensor if single else list(tensor)
    return out


def are_embeddings(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are both embedding arrays or tensors (sentence-transformers' ``similarity`` input)
    rather than sentences."""
    return all(isinstance(x, (np.ndarray, torch.Tensor)) for x in (a, b))


def embedding_cosine(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, *, pairwise: bool) -> torch.Tensor:
    """Cosine of embeddings ([N, D] or [D]), computed in float64: the matrix [N1, N2], or with ``pairwise`` the
    cosine of each pair of rows [N]; a float32 CPU tensor, as sentence-transformers' ``similarity`` returns."""
    za, zb = (
        unit_rows(np.atleast_2d(np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)))
        for x in (a, b)
    )
    if za.shape[1] != zb.shape[1]:
        raise InputError(f"similarity needs embeddings of one width, got {za.shape[1]} and {zb.shape[1]} columns")
    if pairwise:
        if za.shape != zb.shape:
            raise InputError(f"pairwise similarity needs embeddings of one shape, got {za.shape} and {zb.shape}")
        sims = np.einsum("nd,nd->n", za, zb)
    else:
        sims = za @ zb.T
    return torch.from_numpy(sims.astype(np.float32))


class EvaluationRecord:
    """The ``model_card_data`` that sentence-transformers' evaluators write their metrics to
    (``model.model_card_data.set_evaluation_metrics``): :attr:`evaluations` holds one dict per call,
    ``{"evaluator", "metrics", "epoch", "step"}``, oldest first."""

    def __init__(self) -> None:
        self.evaluations: list[dict[str, Any]] = []

    def set_evaluation_metrics(self, evaluator: Any, metrics: dict[str, Any], epoch: int = 0, step: int = 0) -> None:
        """Record ``metrics`` (metric name -> value) of ``evaluator`` (its class name is kept)."""
        self.evaluations.append(
            {"evaluator": type(evaluator).__name__, "metrics": dict(metrics), "epoch": epoch, "step": step}
        )
