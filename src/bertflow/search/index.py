""":class:`EmbeddingIndex`: the rows of a search index (vectors, ids, texts), the identity of the model that
embedded them (checked by :meth:`EmbeddingIndex.check_model`: scores between two embedding spaces are meaningless),
and its folder: ``index.json`` (settings, ids, texts, the model's identity and source, the measured recall, the
sha256 of the other files and ``content_sha256`` of the rest of itself), ``embeddings.safetensors`` (float32 [N, D])
and, for an approximate search, ``ann.faiss`` (its faiss index, so that a query need not rebuild it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._version import __version__
from ..encoding.loading import portable_model_name
from ..errors import CompatibilityError, InputError, ModelFileError
from ..io.files import FOLDER_KINDS, atomic_directory, check_output_folder, folder_present, read_folder
from ..io.formats import (
    FORMAT_VERSION,
    check_format,
    load_arrays,
    read_json,
    save_arrays,
    sha256_file,
    verify_checksums,
    write_json,
)
from ..model_folder import LATER_ENCODER_KEYS
from .ann import Approximate, Backend, VectorSearch, faiss_available, import_faiss

logger = logging.getLogger(__name__)

INDEX_CONFIG = FOLDER_KINDS["index"][0]  # "index.json"
INDEX_EMBEDDINGS = "embeddings.safetensors"
INDEX_ANN = "ann.faiss"
_FORMAT_NAME = FOLDER_KINDS["index"][2]  # "bertflow-index"
#: Key of ``index.json`` holding the sha256 of everything else in it but the backend, which only says how to search
#: the same files and may be changed (``EmbeddingIndex.load(backend=)``).
_CONTENT_KEY = "content_sha256"
ItemId = str | int


@dataclass(frozen=True)
class SearchHit:
    """One search result: the row's ``id`` (as given when it was added; by default its 0-based position), ``score``
    (cosine or dot product with the query; higher is closer), ``text`` (``None`` for an index of bare vectors) and
    ``row`` (0-based position in the index)."""

    id: ItemId
    score: float
    text: str | None
    row: int


def _content_digest(config: dict[str, Any]) -> str:
    """sha256 of ``config`` without its :data:`_CONTENT_KEY` and backend, as canonical JSON (sorted keys, UTF-8):
    the same before writing and after reading, since JSON gives back the same strings, integers and floats."""
    body = {k: v for k, v in config.items() if k not in (_CONTENT_KEY, "backend")}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_ids(ids: Sequence[Any], n: int, taken: set[ItemId]) -> list[ItemId]:
    """``ids`` as a list, checked: one per row, str or int (they go to JSON), unique within themselves and ``taken``."""
    if isinstance(ids, (str, bytes)):
        raise InputError("ids must be a sequence with one id per row, not a single string")
    out = list(ids)
    if len(out) != n:
        raise InputError(f"got {len(out)} ids for {n} rows; give one id per row")
    seen: set[ItemId] = set()
    for i, item in enumerate(out):
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise InputError(f"id {i} is {type(item).__name__} ({item!r:.40}); ids must be strings or integers")
        if item in seen or item in taken:
            raise InputError(f"id {item!r} (row {i}) is used twice; ids must be unique")
        seen.add(item)
    return out


def _identity_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two model identities (``Embedder.identity()``), e.g. ``["encoder fingerprint"]``."""
    differences = []
    for part, keys in (
        ("encoder", ("fingerprint", "pooling", "max_length", "dim", "token_statistics", *LATER_ENCODER_KEYS)),
        ("calibrator", ("type", "fingerprint")),
    ):
        for key in keys:
            old, new = (recorded.get(part) or {}).get(key), (current.get(part) or {}).get(key)
            if key in LATER_ENCODER_KEYS and (old is None or new is None):
                continue  # recorded before bertflow kept it: nothing to compare
            if old != new:
                differences.append(f"{part} {key}")
    return differences


def _describe_model(identity: Mapping[str, Any]) -> str:
    """One line naming an encoder + calibrator identity (as in :meth:`bertflow.Embedder.identity`)."""
    enc, cal = identity.get("encoder", {}), identity.get("calibrator", {})
    return (
        f"encoder {enc.get('model')} (pooling {enc.get('pooling')}, max_length {enc.get('max_length')}, "
        f"fingerprint {enc.get('fingerprint')}) + {cal.get('type')} calibrator (fingerprint {cal.get('fingerprint')})"
    )


def _portable_model(model: dict[str, Any] | None, source: str | None, folder: Path) -> dict[str, Any]:
    """What ``index.json`` records of the model: its identity with the encoder named as a saved model names it
    (:func:`~bertflow.encoding.loading.portable_model_name`), and where it came from: a hub id as ``model_source``, a
    local folder as ``model_local_path`` relative to the index ``folder`` (no absolute path of this machine)."""
    if model and isinstance(model.get("encoder"), dict) and model["encoder"].get("model") is not None:
        model = {**model, "encoder": {**model["encoder"], "model": portable_model_name(str(model["encoder"]["model"]))}}
    if source is not None and Path(source).expanduser().is_dir():
        local = os.path.relpath(Path(source).expanduser().resolve(), folder.expanduser().resolve())
        return {"model": model, "model_source": None, "model_local_path": Path(local).as_posix()}
    return {"model": model, "model_source": source}


class EmbeddingIndex(VectorSearch):
    """Top-k search (exact, or approximate with faiss: :class:`~bertflow.search.ann.VectorSearch`, whose ``kwargs``,
    ``dim`` and search settings, it takes) over vectors, each with an id and an optional text, recording the
    ``model`` that embedded them (:meth:`bertflow.Embedder.identity`; ``None`` for bare vectors), saved with the
    index and checked by :meth:`check_model`. ``EmbeddingIndex.build(vectors, ids=["a", "b"], texts=sentences)
    .search(queries, top_k=2)[0]`` is a list of :class:`SearchHit`, best first."""

    def __init__(self, dim: int, *, model: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(dim, **kwargs)
        self.model = model
        #: Where the model came from (folder or hub id), a hint for ``bertflow search query``; not checked.
        self.model_source: str | None = None
        self.ids: list[ItemId] = []
        self.texts: list[str] | None = None
        self._id_set: set[ItemId] = set()

    @classmethod
    def build(
        cls, embeddings: np.ndarray, ids: Sequence[ItemId] | None = None, texts: Sequence[str] | None = None, **kwargs
    ) -> EmbeddingIndex:
        """An index holding ``embeddings`` [N, D] (stored as float32), with ``ids`` (default: the positions 0..N-1)
        and ``texts`` (one sentence per row, or ``None``); ``kwargs`` go to the class."""
        arr = np.asarray(embeddings)
        if arr.ndim != 2:
            raise InputError(f"embeddings must be 2-D [n_rows, dim], got shape {arr.shape}")
        index = cls(arr.shape[1], **kwargs)
        index.add(arr, ids=ids, texts=texts)
        return index

    def add(
        self, embeddings: np.ndarray, ids: Sequence[ItemId] | None = None, texts: Sequence[str] | None = None
    ) -> None:
        """Append rows. ``ids`` default to their positions in the index; ``texts`` are needed if the index has them.
        CompatibilityError for vectors of another dimension; InputError for bad vectors, ids or texts."""
        arr = self._vectors(embeddings, "embeddings to index")
        n = len(arr)
        if n == 0:
            return
        new_ids = list(range(len(self), len(self) + n)) if ids is None else _check_ids(ids, n, self._id_set)
        if ids is None and any(i in self._id_set for i in new_ids):
            raise InputError("default (positional) ids collide with ids already in the index; pass ids explicitly")
        if texts is not None:
            if isinstance(texts, str):
                raise InputError("texts must be a sequence with one sentence per row, not a single string")
            texts = list(texts)
            if len(texts) != n:
                raise InputError(f"got {len(texts)} texts for {n} rows")
            if self.texts is None and len(self):
                raise InputError("this index was built without texts; add rows without texts too")
        elif self.texts is not None:
            raise InputError("this index stores a text per row; pass texts= for the new rows as well")
        self._append(self._prepare(arr))
        self.ids.extend(new_ids)
        self._id_set.update(new_ids)
        if texts is not None:
            self.texts = (self.texts or []) + texts

    @property
    def embeddings(self) -> np.ndarray:
        """The stored vectors, float32 [N, D] (unit rows for cosine); a copy on CPU."""
        return self._corpus().cpu().numpy().copy()

    def __repr__(self) -> str:
        return (
            f"EmbeddingIndex({len(self)} rows, dim={self.dim}, metric={self.metric!r}, backend={self.backend!r}, "
            f"approximate={self.approximate!r}, texts={self.texts is not None}, "
            f"model={'yes' if self.model else 'none'})"
        )

    def search(self, queries: np.ndarray, top_k: int = 10) -> list[list[SearchHit]]:
        """The ``top_k`` hits (fewer if the index is smaller) of each query vector of ``queries`` [M, D] (one vector
        [D] counts as one row): one list of :class:`SearchHit` per query, best first (:meth:`topk`'s unfilled places
        left out)."""
        scores, rows = self.topk(np.atleast_2d(np.asarray(queries)), top_k)
        texts = self.texts
        return [
            [
                SearchHit(id=self.ids[r], score=float(s), text=None if texts is None else texts[r], row=int(r))
                for s, r in zip(srow, rrow, strict=True)
                if r >= 0
            ]
            for srow, rrow in zip(scores, rows, strict=True)
        ]

    def check_model(self, identity: dict[str, Any]) -> None:
        """Refuse (CompatibilityError) to be used with a model (its :meth:`bertflow.Embedder.identity`) other than
        the one that embedded the rows: another encoder, pooling, truncation or calibrator, or none recorded."""
        if not self.model:
            raise CompatibilityError(
                "this index records no model (it was built from bare vectors), so queries from a model cannot be "
                "checked against it; search it with index.search(vectors), or rebuild it with "
                "bertflow.search.sentences.index_sentences"
            )
        differences = _identity_differences(self.model, identity)
        if differences:
            raise CompatibilityError(
                f"this index was built with {_describe_model(self.model)}, but the model used now is "
                f"{_describe_model(identity)} (different {', '.join(differences)}): rebuild the index with this model "
                "(index_sentences, `bertflow search build`) or load the model it was built with"
            )

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the folder of the module docstring at ``path`` (a new or empty folder, or with ``overwrite`` a
        bertflow index, replaced whole), atomically; an approximate search's recall is measured first. Returns it."""
        check_output_folder(path, "index", overwrite=overwrite)
        kind = self.search_kind() if len(self) else "exact"
        if kind != "exact" and (self.recall is None or self.recall["kind"] != kind):
            self.measure_recall(kind)  # reported with the index, whether auto chose the kind or the caller did
        with atomic_directory(path) as tmp:
            save_arrays(tmp / INDEX_EMBEDDINGS, {"embeddings": self._corpus().cpu().numpy()})
            files = {INDEX_EMBEDDINGS: sha256_file(tmp / INDEX_EMBEDDINGS)}
            ann_file = None
            if kind != "exact":
                faiss = import_faiss(f"approximate={kind!r}", "approximate='exact'")
                faiss.write_index(self._ann_index(kind), str(tmp / INDEX_ANN))
                files[INDEX_ANN] = sha256_file(tmp / INDEX_ANN)
                ann_file = {"kind": kind, "faiss_version": getattr(faiss, "__version__", None)}
            config = {
                "format": _FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "bertflow_version": __version__,
                "metric": self.metric,
                "dim": self.dim,
                "count": len(self),
                "backend": self.backend,
                "approximate": self.approximate,
                "ann_params": self.ann_params,
                **_portable_model(self.model, self.model_source, Path(path)),
                "ids": self.ids,
                "texts": self.texts,
                "recall": self.recall,
                "ann_file": ann_file,
                "files": files,
            }
            config[_CONTENT_KEY] = _content_digest(config)
            write_json(tmp / INDEX_CONFIG, config)
        logger.info("saved an index of %d rows to %s", len(self), path)
        return Path(path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        backend: Backend | None = None,
        device: str | torch.device = "cpu",
        approximate: Approximate | None = None,
    ) -> EmbeddingIndex:
        """Load a folder written by :meth:`save`, searching with the saved ``backend`` and ``approximate`` kind unless
        given (where faiss is missing, torch and exact, with a warning), on ``device``. ModelFileError for a missing,
        truncated, edited or inconsistent index, or one from a newer bertflow."""
        folder = Path(path).expanduser()
        if not folder_present(folder):
            raise ModelFileError(f"{folder} is not a folder; an index is a folder written by EmbeddingIndex.save")
        # Another process may save over the folder while it is read: one complete save or a clear error, never a mix.
        return read_folder(folder, lambda f: cls._read(f, backend, device, approximate))

    @classmethod
    def _read(
        cls, folder: Path, backend: Backend | None, device: str | torch.device, approximate: Approximate | None
    ) -> EmbeddingIndex:
        config = read_json(folder / INDEX_CONFIG)
        if config.get("format") != _FORMAT_NAME:
            raise ModelFileError(f"{folder / INDEX_CONFIG} is not a bertflow index")
        check_format(config, folder / INDEX_CONFIG, kind="search index")
        recorded = config.get(_CONTENT_KEY)
        if not isinstance(recorded, str):
            raise ModelFileError(
                f"{folder / INDEX_CONFIG} records no checksum of its ids and texts (written by an earlier bertflow, or "
                "edited), so they cannot be checked against the vectors: rebuild the index (bertflow search build)"
            )
        if recorded != _content_digest(config):
            raise ModelFileError(
                f"{folder / INDEX_CONFIG} does not match its checksum: its ids, texts or settings were edited or "
                "corrupted; rebuild the index (bertflow search build)"
            )
        verify_checksums(folder, config.get("files"), [], config=folder / INDEX_CONFIG)
        try:
            matrix = load_arrays(folder / INDEX_EMBEDDINGS)["embeddings"]
            ids, texts, dim = config["ids"], config["texts"], int(config["dim"])
            if matrix.ndim != 2 or matrix.shape != (int(config["count"]), dim) or len(ids) != len(matrix):
                raise ValueError(f"embeddings of shape {matrix.shape} for {len(ids)} ids and dim {dim}")
            if texts is not None and len(texts) != len(ids):
                raise ValueError(f"{len(texts)} texts for {len(ids)} ids")
            chosen = backend or config.get("backend", "torch")
            kind = approximate or config.get("approximate", "exact")  # saved before approximate search: exact
            if not faiss_available():
                # Same vectors, exact answers (a superset of what an approximate search finds), only slower.
                if backend is None and chosen == "faiss":
                    logger.warning("%s was saved with the faiss backend, which is not installed; using torch", folder)
                    chosen = "torch"
                if approximate is None and kind in ("hnsw", "ivf"):
                    logger.warning("%s was saved for %s search, which needs faiss (not installed): exact", folder, kind)
                    kind = "exact"
            params = config.get("ann_params") or {}
            index = cls(dim, metric=config["metric"], backend=chosen, device=device, approximate=kind, **params)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFileError(f"{folder} is inconsistent ({type(e).__name__}: {e}); was it edited?") from None
        index.model = config.get("model")
        local = config.get("model_local_path")
        # A local model is recorded relative to the index folder: the two folders may move together.
        index.model_source = str((folder / local).resolve()) if local else config.get("model_source")
        # The stored rows are already prepared (normalised for cosine): appended as they are.
        index._append(matrix.astype(np.float32))
        index.ids, index.texts = _check_ids(ids, len(ids), set()), texts
        index._id_set = set(index.ids)
        index.recall = config.get("recall")
        saved = config.get("ann_file")
        if saved:
            index._read_ann(folder / INDEX_ANN, saved["kind"])
        return index

    def _read_ann(self, file: Path, kind: str) -> None:
        """Reuse the saved faiss index ``file`` of ``kind`` when this index searches with that kind."""
        if not faiss_available() or self.search_kind() != kind:
            return
        import faiss

        try:
            ann = faiss.read_index(str(file))
        except RuntimeError as e:  # written by a faiss this one cannot read: the vectors are enough to rebuild it
            logger.warning("%s cannot be read by this faiss (%s); it is rebuilt from the vectors", file, e)
            return
        if ann.ntotal != len(self) or ann.d != self.dim:
            raise ModelFileError(f"{file} holds {ann.ntotal} x {ann.d} vectors, not {len(self)} x {self.dim}")
        self._ann = (kind, ann)
