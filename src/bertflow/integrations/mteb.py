"""A fitted :class:`~bertflow.Embedder` as an mteb 2.x encoder (:class:`MTEBEncoder`:
``mteb.evaluate(MTEBEncoder(model), tasks)``), and scored pairs already on disk as a local MTEB STS task
(:func:`sts_task`, no hub download). The Embedder is symmetric and has no prompts: MTEB's ``prompt_type`` and task
instructions are ignored, as for a ``SentenceTransformer`` without prompts; similarity is cosine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

try:
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.models.model_meta import ModelMeta
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("bertflow.integrations.mteb needs mteb 2.x: pip install 'mteb>=2,<3'") from e

from ..embedder import Embedder
from ..errors import InputError
from ..io.text import SentencePairs

if TYPE_CHECKING:
    from torch.utils.data import DataLoader


class MTEBEncoder:
    """mteb 2.x's ``EncoderProtocol`` over a fitted :class:`~bertflow.Embedder` (an unfitted one is refused now, not
    halfway through a benchmark), recording results under ``name`` (``"org/name"``; default
    ``"bertflow/<encoder>-<calibrator>"``).

    ``encode`` gathers the texts of every batch MTEB hands it and embeds them with one ``Embedder.encode`` call
    (bertflow's own length-sorted batching; MTEB's ``batch_size`` caps sentences per forward pass). Its
    ``mteb_model_meta`` has ``revision`` = a hash of :meth:`Embedder.identity` (encoder weights and calibrator
    fingerprint), so MTEB's result cache never serves one fit's scores for another's.
    """

    def __init__(self, embedder: Embedder, *, name: str | None = None) -> None:
        if not isinstance(embedder, Embedder):
            raise InputError(f"MTEBEncoder wraps a bertflow Embedder, got {type(embedder).__name__}")
        embedder.check_fitted()
        self.embedder = embedder
        identity = embedder.identity()
        encoder = identity["encoder"]
        base = str(encoder["model"]).rstrip("/").split("/")[-1]
        self.name = name or f"bertflow/{base}-{identity['calibrator']['type']}"
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites={
                "name": self.name,
                "revision": digest,
                "embed_dim": int(identity["calibrator"]["dim"]),
                "max_tokens": int(encoder["max_length"]),
                "n_parameters": sum(p.numel() for p in embedder.encoder.model.parameters()),
                "similarity_fn_name": "cosine",
                "framework": ["PyTorch"],
                "use_instructions": False,
                "open_weights": True,
                "adapted_from": str(encoder["model"]),
                "modalities": ["text"],
                "experiment_kwargs": {"calibrator": identity["calibrator"]["type"], "pooling": encoder["pooling"]},
            }
        )

    def encode(
        self,
        inputs: DataLoader[Any],
        *,
        task_metadata: Any = None,
        hf_split: str | None = None,
        hf_subset: str | None = None,
        prompt_type: Any = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Calibrated embeddings of every text in ``inputs``, in order: float32 [N, D']. The task and prompt
        arguments are unused (no prompts); ``kwargs`` (MTEB's ``encode_kwargs``) go to :meth:`Embedder.encode`."""
        texts: list[str] = []
        for batch in inputs:
            if not isinstance(batch, dict) or "text" not in batch:
                keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
                raise InputError(f"MTEBEncoder encodes text only; this task's batches hold {keys}")
            texts.extend(batch["text"])
        return self.embedder.encode(texts, **kwargs)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity matrix [N1, N2] (float32 tensor, as sentence-transformers returns)."""
        return self.embedder.similarity(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine of each pair of rows [N] (float32 tensor)."""
        return self.embedder.similarity_pairwise(embeddings1, embeddings2)

    def __repr__(self) -> str:
        return f"MTEBEncoder({self.embedder!r}, name={self.name!r})"


def sts_task(
    name: str,
    pairs: SentencePairs | dict[str, SentencePairs],
    *,
    min_score: float = 0.0,
    max_score: float = 5.0,
    languages: Iterable[str] = ("eng-Latn",),
    description: str = "STS pairs read from local files by bertflow",
) -> AbsTaskSTS:
    """An MTEB STS task named ``name`` over scored pairs already in memory (no hub download), ready for
    ``mteb.evaluate``: an ``AbsTaskSTS`` whose main score is ``cosine_spearman`` (in [-1, 1]).

    ``pairs``: scored pairs (``read_pairs(path)``, ``load_sts_task(...).eval_subsets[...]``), or a dict of them by
    split name (a single set becomes the ``"test"`` split); ``min_score``, ``max_score``: the gold scale, which MTEB
    rescales to [0, 1]; ``languages``: MTEB language codes.
    """
    from datasets import Dataset

    splits = {"test": pairs} if isinstance(pairs, SentencePairs) else dict(pairs)
    if not splits:
        raise InputError("sts_task needs at least one split of pairs")
    data = {}
    for split, sp in splits.items():
        if sp.scores is None or len(sp) == 0:
            raise InputError(f"split {split!r} of {name} has {'no pairs' if len(sp) == 0 else 'no gold scores'}")
        data[split] = Dataset.from_dict(
            {"sentence1": list(sp.sentences1), "sentence2": list(sp.sentences2), "score": sp.scores.tolist()}
        )
    metadata = TaskMetadata(
        name=name,
        dataset={"path": f"local/{name}", "revision": _pairs_digest(splits)},
        description=description,
        type="STS",
        category="t2t",
        modalities=["text"],
        eval_splits=list(data),
        eval_langs=list(languages),
        main_score="cosine_spearman",
    )

    class LocalSTS(AbsTaskSTS):
        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:  # noqa: ARG002 - already in memory
            self.dataset = data
            self.data_loaded = True

    LocalSTS.__name__ = LocalSTS.__qualname__ = f"LocalSTS[{name}]"
    LocalSTS.min_score, LocalSTS.max_score = min_score, max_score
    LocalSTS.metadata = metadata
    task = LocalSTS()
    task.load_data()
    return task


def _pairs_digest(splits: dict[str, SentencePairs]) -> str:
    """A hash of the pairs and scores: the task's dataset revision, so cached MTEB results follow the data."""
    h = hashlib.sha256()
    for split in sorted(splits):
        sp = splits[split]
        h.update(split.encode())
        for s1, s2, score in zip(sp.sentences1, sp.sentences2, np.asarray(sp.scores).tolist(), strict=True):
            h.update(f"{s1}\t{s2}\t{score!r}\n".encode())
    return h.hexdigest()[:16]
