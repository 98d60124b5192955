"""Semantic search over calibrated embeddings: a top-k index (exact, or approximate at scale) that saves to disk with
its model's identity.

:class:`EmbeddingIndex` holds vectors [N, D] with an id and (optionally) a text per row, and answers top-k
queries by cosine (default) or dot product. Two backends give the same, exact results:

- ``"torch"`` (default, no extra dependency): the score matrix is computed in blocks of
  ``query_chunk_size`` x ``corpus_chunk_size`` and each block's top-k is merged into a running top-k, so memory
  stays bounded by one block whatever the corpus size (as sentence-transformers' ``util.semantic_search``).
- ``"faiss"`` (``pip install faiss-cpu``, the ``bertflow[faiss]`` extra): a ``faiss.IndexFlatIP``, faster on CPU
  for many queries.

Approximate search (``approximate=``, needs faiss) trades a little recall for speed on large corpora:

- ``"exact"``: always the exact backend above.
- ``"hnsw"``: a ``faiss.IndexHNSWFlat`` with the inner-product metric (on unit rows for cosine), ``hnsw_m`` links
  per node, ``ef_search`` candidates per query (higher: better recall, slower).
- ``"ivf"``: a ``faiss.IndexIVFFlat`` with ``nlist = round(sqrt(N))`` lists (k-means trained on the rows) and
  ``nprobe`` lists visited per query; ``nprobe >= nlist`` visits every list and is exact.
- ``"auto"`` (default): exact below :data:`AUTO_APPROXIMATE_MIN_ROWS` rows. From there on, with faiss installed, HNSW
  only if its recall@10, measured on a held-out sample of the index's own rows (:meth:`EmbeddingIndex.measure_recall`),
  reaches :data:`AUTO_MIN_RECALL`; exact otherwise. Calibrated (whitened, flow) embeddings are close to isotropic, the
  hard case for HNSW, so a fixed switch could silently lose most true neighbours. The measurement is kept in
  :attr:`EmbeddingIndex.recall` (and ``index.json``) and reported by ``bertflow search build``.

The approximate structure is built from the stored vectors at the first query after rows were added (IVF needs all
rows to train). :meth:`EmbeddingIndex.save` writes it too (``ann.faiss``, with its sha256 in ``index.json``), so a
CLI query loads it instead of rebuilding it (HNSW over 100k x 384 rows takes ~40 s to build on 2 CPU cores); a
faiss that cannot read the file (another version) rebuilds it from the vectors, with a warning. ``index.json`` records
the requested kind and its parameters; where faiss is missing a saved approximate index loads as exact (with a
warning), and ``load(approximate="exact")`` asks for that. An approximate search may
find fewer than ``k`` rows (IVF with small ``nprobe``); :meth:`EmbeddingIndex.topk` marks the missing places with
row ``-1`` and score ``-inf``, and :meth:`EmbeddingIndex.search` leaves them out.

A saved index is a folder::

    my-index/
      index.json                 format and library version, metric, dimension, ids, texts, the identity of the
                                 model that embedded the rows (encoder config + fingerprint, calibrator type +
                                 fingerprint), sha256 of the embeddings file, and the sha256 of all the rest of
                                 index.json (``content_sha256``), so an edited id or text is refused on load;
                                 the kind of search (``approximate``) and its ``ann_params``; where the model
                                 came from: a hub id (``model_source``) or a local folder's path relative to
                                 the index folder (``model_local_path``), never an absolute path
      embeddings.safetensors     float32 [N, D] (unit rows for cosine)
      ann.faiss                  only for an approximate search: the faiss HNSW / IVF index (faiss.write_index)

Searching a saved index with a different model is refused (:meth:`EmbeddingIndex.check_model`): scores between
vectors of two different embedding spaces are meaningless, and nothing else would reveal the mistake.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import torch

from ._version import __version__
from .encoding.loading import portable_model_name
from .errors import CompatibilityError, InputError, ModelFileError
from .io.files import FOLDER_KINDS, atomic_directory, check_output_folder, read_folder
from .io.formats import FORMAT_VERSION, check_format, load_arrays, read_json, save_arrays, sha256_file, write_json
from .linalg import unit_rows
from .model_folder import LATER_ENCODER_KEYS
from .validation import check_finite, is_blank, validate_sentences

if TYPE_CHECKING:
    from .embedder import Embedder

__all__ = [
    "SearchHit",
    "EmbeddingIndex",
    "INDEX_CONFIG",
    "INDEX_EMBEDDINGS",
    "AUTO_APPROXIMATE_MIN_ROWS",
    "AUTO_MIN_RECALL",
    "faiss_available",
]

logger = logging.getLogger(__name__)

INDEX_CONFIG = FOLDER_KINDS["index"][0]  # "index.json"
INDEX_EMBEDDINGS = "embeddings.safetensors"
INDEX_ANN = "ann.faiss"
_FORMAT_NAME = FOLDER_KINDS["index"][2]  # "bertflow-index"

Metric = Literal["cosine", "dot"]
Backend = Literal["torch", "faiss"]
#: The backends, as the CLI lists and checks them.
BACKENDS: tuple[str, ...] = get_args(Backend)
Approximate = Literal["auto", "exact", "hnsw", "ivf"]
APPROXIMATE_KINDS = ("auto", "exact", "hnsw", "ivf")

#: ``approximate="auto"`` searches exactly below this many rows, and from it on considers HNSW (when faiss is
#: installed and its recall reaches :data:`AUTO_MIN_RECALL`): below it an exact search of one query takes a few
#: milliseconds on a CPU, and recall below 1 buys little.
AUTO_APPROXIMATE_MIN_ROWS = 100_000
#: ``approximate="auto"`` chooses HNSW only when its measured recall@10 reaches this (else it searches exactly).
AUTO_MIN_RECALL = 0.95
#: Rows drawn (seeded) as held-out queries by :meth:`EmbeddingIndex.measure_recall`.
RECALL_SAMPLE = 500
ItemId = str | int


@dataclass(frozen=True)
class SearchHit:
    """One search result.

    Attributes:
        id: the row's id (as given when the row was added; by default its 0-based position).
        score: cosine similarity (or dot product) with the query; higher is closer.
        text: the row's sentence, or ``None`` for an index built from bare vectors.
        row: 0-based position of the row in the index.
    """

    id: ItemId
    score: float
    text: str | None
    row: int


def faiss_available() -> bool:
    """Whether the optional ``faiss`` package (``faiss-cpu``) can be imported."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _import_faiss(
    what: str = "backend 'faiss'", alternative: str = "backend='torch', which gives the same exact results"
) -> Any:
    try:
        import faiss
    except ImportError:
        raise InputError(
            f"{what} needs the faiss package: pip install faiss-cpu (or bertflow[faiss]); or use {alternative}"
        ) from None
    return faiss


#: Key of ``index.json`` holding the sha256 of everything else in it (ids, texts, model identity, settings) but the
#: backend, which only says how to search the same files and may be changed (``EmbeddingIndex.load(backend=)``).
_CONTENT_KEY = "content_sha256"


def _content_digest(config: dict[str, Any]) -> str:
    """sha256 of ``config`` without its :data:`_CONTENT_KEY` and backend, as canonical JSON (sorted keys, UTF-8):
    the same before writing and after reading, since JSON gives back the same strings, integers and floats."""
    body = {k: v for k, v in config.items() if k not in (_CONTENT_KEY, "backend")}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _by_score_then_row(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic order among equal scores (block merging and faiss do not guarantee one): by row."""
    order = np.lexsort((rows, -scores), axis=-1)
    return np.take_along_axis(scores, order, -1), np.take_along_axis(rows, order, -1).astype(np.int64)


def _check_ids(ids: Sequence[Any], n: int, taken: set[ItemId]) -> list[ItemId]:
    """Validate ids: one per row, str or int (they go to JSON), unique within themselves and the index."""
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


def identity_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two model identities (``Embedder.identity()``: an encoder config and a
    :func:`calibrator_identity`), e.g. ``["encoder fingerprint", "calibrator type"]``; empty for the same model."""
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


def describe_model(identity: Mapping[str, Any] | None) -> str:
    """One line naming an encoder + calibrator identity (as in :meth:`bertflow.Embedder.identity`)."""
    if not identity:
        return "an unknown model"
    enc, cal = identity.get("encoder", {}), identity.get("calibrator", {})
    return (
        f"encoder {enc.get('model')} (pooling {enc.get('pooling')}, max_length {enc.get('max_length')}, "
        f"fingerprint {enc.get('fingerprint')}) + {cal.get('type')} calibrator (fingerprint {cal.get('fingerprint')})"
    )


def _portable_model(model: dict[str, Any] | None, source: str | None, folder: Path) -> dict[str, Any]:
    """What ``index.json`` records of the model: its identity with the encoder named as a saved model names it (a
    local folder by its name, :func:`~bertflow.encoding.loading.portable_model_name`), and where it came from: a hub
    id as ``model_source``, a local folder as ``model_local_path``, relative to the index ``folder``, so that no
    absolute path of this machine is written and the two folders can move together."""
    if model and isinstance(model.get("encoder"), dict) and model["encoder"].get("model") is not None:
        model = {**model, "encoder": {**model["encoder"], "model": portable_model_name(str(model["encoder"]["model"]))}}
    if source is not None and Path(source).expanduser().is_dir():
        local = os.path.relpath(Path(source).expanduser().resolve(), folder.expanduser().resolve())
        return {"model": model, "model_source": None, "model_local_path": Path(local).as_posix()}
    return {"model": model, "model_source": source}


class EmbeddingIndex:
    """Top-k search (exact, or approximate with faiss) over a set of vectors, each with an id and an optional text.

    Args:
        dim: dimension D of the vectors.
        metric: ``"cosine"`` (rows and queries are L2-normalised; bertflow's similarity) or ``"dot"``.
        backend: ``"torch"`` (blockwise exact top-k, no extra dependency) or ``"faiss"`` (exact
            ``IndexFlatIP``; needs ``faiss-cpu``).
        device: where the torch backend keeps the vectors and computes scores (``"cpu"``, ``"cuda"`` ...).
        model: identity of the model whose embeddings the rows are (see :meth:`bertflow.Embedder.identity`);
            ``None`` for bare vectors. Saved with the index and checked by :meth:`check_model`.
        query_chunk_size, corpus_chunk_size: block sizes of the torch backend (results do not depend on them).
        approximate: ``"auto"`` (exact below :data:`AUTO_APPROXIMATE_MIN_ROWS` rows, else HNSW if faiss is
            installed and its measured recall reaches :data:`AUTO_MIN_RECALL`), ``"exact"``, ``"hnsw"`` or
            ``"ivf"`` (both need faiss); see the module docstring.
        hnsw_m: HNSW links per node (faiss ``M``).
        ef_search: HNSW candidate list size per query (faiss ``efSearch``); at least ``k`` is used.
        ef_construction: HNSW candidate list size while inserting (faiss ``efConstruction``).
        nlist: IVF lists; ``None``: ``round(sqrt(N))`` at build time.
        nprobe: IVF lists visited per query (capped at ``nlist``).

    Example:
        >>> index = EmbeddingIndex.build(vectors, ids=["a", "b", "c"], texts=sentences)
        >>> index.search(query_vector, top_k=2)
        [SearchHit(id='b', score=0.91, text='...', row=1), SearchHit(id='a', score=0.42, text='...', row=0)]
    """

    def __init__(
        self,
        dim: int,
        *,
        metric: Metric = "cosine",
        backend: Backend = "torch",
        device: str | torch.device = "cpu",
        model: dict[str, Any] | None = None,
        query_chunk_size: int = 1024,
        corpus_chunk_size: int = 65536,
        approximate: Approximate = "auto",
        hnsw_m: int = 32,
        ef_search: int = 64,
        ef_construction: int = 80,
        nlist: int | None = None,
        nprobe: int = 16,
    ) -> None:
        if int(dim) < 1:
            raise InputError(f"dim must be positive, got {dim}")
        if metric not in ("cosine", "dot"):
            raise InputError(f"metric must be 'cosine' or 'dot', got {metric!r}")
        if backend not in BACKENDS:
            raise InputError(f"backend must be {' or '.join(map(repr, BACKENDS))}, got {backend!r}")
        if query_chunk_size < 1 or corpus_chunk_size < 1:
            raise InputError("query_chunk_size and corpus_chunk_size must be positive")
        if approximate not in APPROXIMATE_KINDS:
            raise InputError(f"approximate must be one of {', '.join(APPROXIMATE_KINDS)}; got {approximate!r}")
        for name, value in (
            ("hnsw_m", hnsw_m),
            ("ef_search", ef_search),
            ("ef_construction", ef_construction),
            ("nprobe", nprobe),
            ("nlist", 1 if nlist is None else nlist),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        if approximate in ("hnsw", "ivf"):
            _import_faiss(f"approximate={approximate!r}", "approximate='exact'")
        self.dim = int(dim)
        self.metric: Metric = metric
        self.backend: Backend = backend
        self.device = torch.device(device)
        self.model = model
        #: Where the model came from (folder or hub id), a hint for ``bertflow search query``; not checked.
        self.model_source: str | None = None
        self.query_chunk_size = int(query_chunk_size)
        self.corpus_chunk_size = int(corpus_chunk_size)
        self.ids: list[ItemId] = []
        self.texts: list[str] | None = None
        self._id_set: set[ItemId] = set()
        # Added blocks are concatenated lazily: appending to one tensor per add() would copy O(N^2) bytes.
        self._blocks: list[torch.Tensor] = []
        self._matrix: torch.Tensor = torch.empty((0, self.dim), dtype=torch.float32, device=self.device)
        self.approximate: Approximate = approximate
        self.ann_params: dict[str, int | None] = {
            "hnsw_m": hnsw_m,
            "ef_search": ef_search,
            "ef_construction": ef_construction,
            "nlist": nlist,
            "nprobe": nprobe,
        }
        # The approximate faiss index over all rows, built at the first query after an add (None: not built).
        self._ann: Any = None
        #: The last recall measurement (:meth:`measure_recall`) for the current rows, or ``None``.
        self.recall: dict[str, Any] | None = None
        self._auto_noted = False
        self._faiss: Any = None
        if backend == "faiss":
            self._faiss = _import_faiss().IndexFlatIP(self.dim)

    # -- building ----------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        embeddings: np.ndarray,
        ids: Sequence[ItemId] | None = None,
        texts: Sequence[str] | None = None,
        *,
        metric: Metric = "cosine",
        backend: Backend = "torch",
        device: str | torch.device = "cpu",
        model: dict[str, Any] | None = None,
        approximate: Approximate = "auto",
        **ann_params: int | None,
    ) -> EmbeddingIndex:
        """An index holding ``embeddings`` [N, D] (float, any precision; stored as float32).

        Args:
            ids: one str or int per row, unique; default: the row positions 0..N-1.
            texts: one sentence per row (returned in hits), or ``None``.
            metric, backend, device, model, approximate: see the class.
            ann_params: ``hnsw_m``, ``ef_search``, ``ef_construction``, ``nlist``, ``nprobe`` (see the class).
        """
        arr = np.asarray(embeddings)
        if arr.ndim != 2:
            raise InputError(f"embeddings must be 2-D [n_rows, dim], got shape {arr.shape}")
        index = cls(
            arr.shape[1],
            metric=metric,
            backend=backend,
            device=device,
            model=model,
            approximate=approximate,
            **ann_params,  # type: ignore[arg-type]
        )
        index.add(arr, ids=ids, texts=texts)
        return index

    @classmethod
    def from_sentences(
        cls,
        embedder: Embedder,
        sentences: Sequence[str],
        ids: Sequence[ItemId] | None = None,
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        backend: Backend = "torch",
        device: str | torch.device = "cpu",
        approximate: Approximate = "auto",
        **ann_params: int | None,
    ) -> EmbeddingIndex:
        """A cosine index of ``sentences`` embedded by ``embedder`` (a fitted :class:`~bertflow.embedder.Embedder`),
        recording its :meth:`~bertflow.embedder.Embedder.identity` so that :meth:`query` and a saved copy refuse
        any other model.

        Args:
            sentences: the sentences to search (a list; for a file use :meth:`from_file`).
            ids: one str or int id per sentence, unique; default: positions 0..N-1.
            batch_size, show_progress_bar: as in :meth:`Embedder.encode` (``None`` shows a bar from 4,096 sentences).
            backend, device, approximate, ann_params: see the class.
        """
        if isinstance(sentences, str):
            raise InputError("from_sentences takes a list of sentences; to index a file use from_file(embedder, path)")
        items = validate_sentences(sentences)
        if not items:
            raise InputError("the corpus is empty: nothing to index")
        index = cls(
            embedder.calibrator_dim(),
            backend=backend,
            device=device,
            model=embedder.identity(),
            approximate=approximate,
            **ann_params,  # type: ignore[arg-type]
        )
        index.model_source = embedder.source
        index.add_sentences(embedder, items, ids, batch_size=batch_size, show_progress_bar=show_progress_bar)
        logger.info("indexed %d sentences (%s backend)", len(index), backend)
        return index

    @classmethod
    def from_file(
        cls,
        embedder: Embedder,
        path: str | Path,
        *,
        column: str | int | None = None,
        unique: bool = False,
        errors: Literal["strict", "replace"] = "strict",
        **kwargs: Any,
    ) -> EmbeddingIndex:
        """:meth:`from_sentences` on a UTF-8 file: one sentence per line, or one ``column`` of a TSV with a header.

        Ids are 1-based line numbers for a text file and 1-based data-row numbers for a TSV. ``unique`` drops
        repeated sentences (keeping the first); ``kwargs`` go to :meth:`from_sentences`.
        """
        from .io.text import iter_lines, read_tsv_column

        if column is None:
            rows = [(number, text) for number, text in iter_lines(path, errors=errors) if not is_blank(text)]
        else:
            rows = list(enumerate(read_tsv_column(path, column, errors=errors, refuse_blank=True), start=1))
        if unique:
            first: dict[str, int] = {}
            for number, text in rows:
                first.setdefault(text, number)
            rows = [(number, text) for text, number in first.items()]
        if not rows:
            raise InputError(f"no sentences in {path}")
        return cls.from_sentences(embedder, [t for _, t in rows], [n for n, _ in rows], **kwargs)

    def add_sentences(
        self,
        embedder: Embedder,
        sentences: Sequence[str],
        ids: Sequence[ItemId] | None = None,
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> None:
        """Embed ``sentences`` with ``embedder`` (checked against the model of the index first) and append them
        with their texts, streaming chunk by chunk (:meth:`Embedder.iter_encode`)."""
        self.check_model(embedder.identity())
        items = validate_sentences(sentences)
        if ids is not None and len(ids) != len(items):
            raise InputError(f"got {len(ids)} ids for {len(items)} sentences; give one id per sentence")
        start = 0
        for part in embedder.iter_encode(items, batch_size=batch_size, show_progress_bar=show_progress_bar):
            stop = start + len(part)
            self.add(part, None if ids is None else list(ids[start:stop]), items[start:stop])
            start = stop

    def _vectors(self, x: object, what: str) -> np.ndarray:
        """``x`` as float32 [n, dim]: numeric, 2-D, of this index's dimension (else CompatibilityError), finite."""
        try:
            arr = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise InputError(f"{what} are not a numeric array: {e}") from None
        if arr.ndim != 2:
            raise InputError(f"{what} must be 2-D [n_rows, dim], got shape {arr.shape}")
        if arr.shape[1] != self.dim:
            raise CompatibilityError(
                f"{what} are {arr.shape[1]}-dimensional but the index holds {self.dim}-dimensional vectors: embed "
                "them with the model the index was built with"
            )
        check_finite(arr, what=what)
        return arr

    def add(
        self, embeddings: np.ndarray, ids: Sequence[ItemId] | None = None, texts: Sequence[str] | None = None
    ) -> None:
        """Append rows. ``ids`` default to their positions in the index; ``texts`` are needed if the index has them.

        Raises:
            CompatibilityError: vectors of another dimension.
            InputError: NaN/Inf, duplicate or malformed ids, texts missing or of the wrong count.
        """
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
        block = torch.from_numpy(self._prepare(arr))
        self._blocks.append(block.to(self.device))
        if self._faiss is not None:
            self._faiss.add(block.numpy())
        self._ann = None  # rebuilt with the new rows at the next query
        self.recall = None  # measured again for the new rows
        self.ids.extend(new_ids)
        self._id_set.update(new_ids)
        if texts is not None:
            self.texts = (self.texts or []) + texts

    def _prepare(self, arr: np.ndarray) -> np.ndarray:
        """float32 C-contiguous rows, L2-normalised for cosine (zero rows stay zero and score 0)."""
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if self.metric == "cosine":
            arr = np.ascontiguousarray(unit_rows(arr), dtype=np.float32)
        return arr

    def _corpus(self) -> torch.Tensor:
        if self._blocks:
            self._matrix = torch.cat([self._matrix, *self._blocks]) if len(self._matrix) else torch.cat(self._blocks)
            self._blocks = []
        return self._matrix

    # -- facts -------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def embeddings(self) -> np.ndarray:
        """The stored vectors, float32 [N, D] (unit rows for cosine); a copy on CPU."""
        return self._corpus().cpu().numpy().copy()

    def search_kind(self) -> Literal["exact", "hnsw", "ivf"]:
        """How a query is answered now: ``approximate`` with ``"auto"`` resolved for the current size."""
        if self.approximate != "auto":
            return self.approximate
        if len(self) < AUTO_APPROXIMATE_MIN_ROWS:
            return "exact"
        if not faiss_available():
            if not self._auto_noted:
                logger.info(
                    "%d rows (>= %d) would use an approximate HNSW search, but faiss is not installed: searching "
                    "exactly (pip install faiss-cpu for faster search)",
                    len(self),
                    AUTO_APPROXIMATE_MIN_ROWS,
                )
                self._auto_noted = True
            return "exact"
        if self.recall is None or self.recall["kind"] != "hnsw":
            self.measure_recall("hnsw")
        assert self.recall is not None
        if self.recall["recall_at_k"] >= AUTO_MIN_RECALL:
            return "hnsw"
        if self._ann is not None:
            self._ann = None  # the graph built to measure recall is not used: free it
            logger.info(
                "HNSW recall@10 %.3f < %.2f on this index: searching exactly (approximate='hnsw' with a larger "
                "ef_search to force it)",
                self.recall["recall_at_k"],
                AUTO_MIN_RECALL,
            )
        return "exact"

    def measure_recall(
        self, kind: Literal["hnsw", "ivf"], *, k: int = 10, sample: int = RECALL_SAMPLE, seed: int = 0
    ) -> dict[str, Any]:
        """Recall@k of the approximate search ``kind`` against the exact one, on a held-out sample of the index:
        ``sample`` rows drawn with ``seed`` are the queries, and each query's own row is left out of both answers
        (it would be a free hit). Builds the faiss index if needed; sets and returns :attr:`recall`:
        ``{"kind", "k", "recall_at_k", "sample", "rows", "min_recall"}`` (recall in [0, 1]).

        Raises:
            InputError: faiss missing, or an index of fewer than 2 rows.
        """
        n = len(self)
        if n < 2:
            raise InputError("measuring recall needs an index of at least 2 rows")
        picked = np.sort(np.random.default_rng(seed).choice(n, size=min(int(sample), n), replace=False))
        queries = np.ascontiguousarray(self._corpus()[torch.from_numpy(picked).to(self.device)].cpu().numpy())
        depth = min(int(k) + 1, n)
        _, exact = self._exact_topk(queries, depth)
        _, approx = self._ann_topk(kind, queries, depth)
        hits = []
        for own, e, a in zip(picked, exact, approx, strict=True):
            truth = [r for r in e if r != own][:k]
            found = {r for r in a if r != own and r >= 0}
            hits.append(len(found.intersection(truth)) / max(1, len(truth)))
        self.recall = {
            "kind": kind,
            "k": int(k),
            "recall_at_k": round(float(np.mean(hits)), 4),
            "sample": len(picked),
            "rows": n,
            "min_recall": AUTO_MIN_RECALL,
        }
        logger.info(
            "%s search: recall@%d %.3f on %d held-out rows of %d", kind, k, self.recall["recall_at_k"], len(picked), n
        )
        return self.recall

    def _ann_index(self, kind: str) -> Any:
        """The faiss HNSW or IVF index over the current rows (inner product), built once per set of rows."""
        if self._ann is not None and self._ann[0] == kind:
            return self._ann[1]
        faiss = _import_faiss(f"approximate={kind!r}", "approximate='exact'")
        corpus = np.ascontiguousarray(self._corpus().cpu().numpy(), dtype=np.float32)
        p = self.ann_params
        if kind == "hnsw":
            ann = faiss.IndexHNSWFlat(self.dim, int(p["hnsw_m"]), faiss.METRIC_INNER_PRODUCT)
            ann.hnsw.efConstruction = int(p["ef_construction"])
        else:
            nlist = min(len(corpus), int(p["nlist"] or max(1, round(len(corpus) ** 0.5))))
            ann = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
            ann.cp.seed = 1234  # reproducible k-means lists
            ann.train(corpus)
        ann.add(corpus)
        self._ann = (kind, ann)
        return ann

    def __repr__(self) -> str:
        return (
            f"EmbeddingIndex({len(self)} rows, dim={self.dim}, metric={self.metric!r}, backend={self.backend!r}, "
            f"approximate={self.approximate!r}, "
            f"texts={self.texts is not None}, model={'yes' if self.model else 'none'})"
        )

    # -- searching ---------------------------------------------------------------------------------------

    def topk(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best rows for each query, as arrays (the raw form of :meth:`search`).

        Args:
            queries: float [M, D] query vectors (normalised here for cosine).
            k: results per query; capped at the index size.

        Returns:
            ``(scores, rows)``: float32 [M, k'] sorted best first, and int64 [M, k'] row positions, where
            ``k' = min(k, len(self))``. Equal scores are ordered by row; which of several rows tied at the
            k-th place is kept is unspecified. An approximate search (see :meth:`search_kind`) may miss true
            neighbours, and marks places it could not fill with row ``-1`` and score ``-inf``.
        """
        if k < 1:
            raise InputError(f"top_k must be at least 1, got {k}")
        q = self._vectors(queries, "query embeddings")
        k = min(int(k), len(self))
        if k == 0 or len(q) == 0:
            return np.empty((len(q), k), np.float32), np.empty((len(q), k), np.int64)
        q = self._prepare(q)
        kind = self.search_kind()
        return self._exact_topk(q, k) if kind == "exact" else self._ann_topk(kind, q, k)

    def _ann_topk(self, kind: str, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Approximate top-k of prepared queries ``q`` (see :meth:`topk`)."""
        ann = self._ann_index(kind)
        if kind == "hnsw":
            ann.hnsw.efSearch = max(int(self.ann_params["ef_search"]), k)
        else:
            ann.nprobe = min(int(self.ann_params["nprobe"]), ann.nlist)
        scores, rows = ann.search(q, k)
        return _by_score_then_row(np.where(rows < 0, -np.inf, scores).astype(np.float32), rows)

    def _exact_topk(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of prepared queries ``q`` (see :meth:`topk`)."""
        if self._faiss is not None:
            scores, rows = self._faiss.search(q, k)
        else:
            scores, rows = self._torch_topk(torch.from_numpy(q), k)
        return _by_score_then_row(scores, rows)

    @torch.inference_mode()
    def _torch_topk(self, q: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        corpus = self._corpus()
        all_scores, all_rows = [], []
        for qs in range(0, len(q), self.query_chunk_size):
            qc = q[qs : qs + self.query_chunk_size].to(self.device)
            best_s: torch.Tensor | None = None
            best_i: torch.Tensor | None = None
            for cs in range(0, len(corpus), self.corpus_chunk_size):
                block = qc @ corpus[cs : cs + self.corpus_chunk_size].T
                s, i = torch.topk(block, min(k, block.shape[1]), dim=1)
                i = i + cs
                if best_s is not None:
                    # Merge this block's candidates into the running top-k (at most 2k columns).
                    s, pos = torch.topk(torch.cat([best_s, s], 1), min(k, best_s.shape[1] + s.shape[1]), dim=1)
                    i = torch.gather(torch.cat([best_i, i], 1), 1, pos)
                best_s, best_i = s, i
            all_scores.append(best_s.float().cpu())
            all_rows.append(best_i.cpu())
        return torch.cat(all_scores).numpy(), torch.cat(all_rows).numpy()

    def search(self, queries: np.ndarray, top_k: int = 10) -> list[list[SearchHit]] | list[SearchHit]:
        """Top-k hits per query vector.

        Args:
            queries: one vector [D] or a matrix [M, D].
            top_k: hits per query (fewer if the index is smaller).

        Returns:
            For one vector, a list of :class:`SearchHit` best first; for a matrix, one such list per row.
        """
        arr = np.asarray(queries)
        single = arr.ndim == 1
        scores, rows = self.topk(arr[None, :] if single else arr, top_k)
        hits = [
            [
                SearchHit(
                    id=self.ids[r],
                    score=float(s),
                    text=None if self.texts is None else self.texts[r],
                    row=int(r),
                )
                for s, r in zip(srow, rrow, strict=True)
                if r >= 0  # a place an approximate search could not fill
            ]
            for srow, rrow in zip(scores, rows, strict=True)
        ]
        return hits[0] if single else hits

    def query(
        self,
        embedder: Embedder,
        queries: str | Sequence[str],
        top_k: int = 10,
        *,
        show_progress_bar: bool | None = None,
    ) -> list[list[SearchHit]]:
        """The ``top_k`` rows closest to each query sentence, embedded by ``embedder`` (cosine in its calibrated
        space).

        Args:
            embedder: the model the index was built with (checked first: :meth:`check_model`).
            queries: a list of sentences (one string counts as a list of one).
            top_k: hits per query.
            show_progress_bar: for embedding the queries, as in :meth:`Embedder.encode`.

        Returns:
            one list of :class:`SearchHit` per query, best first.

        Raises:
            CompatibilityError: the index was built with another model (or from bare vectors).
        """
        self.check_model(embedder.identity())
        items = [queries] if isinstance(queries, str) else list(queries)
        vectors = np.atleast_2d(embedder.encode(items, show_progress_bar=show_progress_bar))
        return self.search(vectors, top_k=top_k)  # type: ignore[return-value]  # a matrix: one list per query

    # -- model identity ----------------------------------------------------------------------------------

    def check_model(self, identity: dict[str, Any]) -> None:
        """Refuse to be used with a model other than the one that embedded the rows.

        Args:
            identity: the model's identity (:meth:`bertflow.Embedder.identity`).

        Raises:
            CompatibilityError: the index records no model, or another encoder, pooling, truncation or calibrator.
        """
        if not self.model:
            raise CompatibilityError(
                "this index records no model (it was built from bare vectors), so queries from a model cannot be "
                "checked against it; search it with index.search(vectors), or rebuild it with "
                "EmbeddingIndex.from_sentences"
            )
        mine, theirs = self.model, identity
        differences = identity_differences(mine, theirs)
        if differences:
            raise CompatibilityError(
                f"this index was built with {describe_model(mine)}, but the model used now is "
                f"{describe_model(theirs)} (different {', '.join(differences)}): rebuild the index with this model "
                "(EmbeddingIndex.from_sentences, `bertflow search build`) or load the model it was built with"
            )

    # -- persistence -------------------------------------------------------------------------------------

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the folder described in the module docstring, atomically. Returns its path.

        Args:
            path: a new or empty folder, or (with ``overwrite``) a bertflow index, replaced whole.
            overwrite: replace an index already at ``path`` (refused without it since bertflow 0.x).

        Raises:
            OutputError: ``path`` may not be written (see :func:`~bertflow.io.files.check_output_folder`).
        """
        check_output_folder(path, "index", overwrite=overwrite)
        kind = self.search_kind() if len(self) else "exact"
        if kind != "exact" and (self.recall is None or self.recall["kind"] != kind):
            self.measure_recall(kind)  # reported with the index, whether auto chose the kind or the caller did
        with atomic_directory(path) as tmp:
            save_arrays(tmp / INDEX_EMBEDDINGS, {"embeddings": self._corpus().cpu().numpy()})
            files = {INDEX_EMBEDDINGS: sha256_file(tmp / INDEX_EMBEDDINGS)}
            ann_file = None
            if kind != "exact":
                faiss = _import_faiss(f"approximate={kind!r}", "approximate='exact'")
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
        """Load a folder written by :meth:`save`.

        Args:
            backend: override the saved backend (the files are the same for both); by default the saved one, or
                torch when the index was saved with faiss and faiss is not installed.
            device: where the torch backend keeps the vectors.
            approximate: override the saved kind of search (``"exact"`` always works); by default the saved one, or
                exact when it needs faiss and faiss is not installed (with a warning).

        Raises:
            ModelFileError: a missing, truncated, edited or inconsistent index, or one written by a newer bertflow.
        """
        folder = Path(path).expanduser()
        # Another process may save over the folder while it is read: one complete save or a clear error, never a mix.
        return read_folder(
            folder, lambda f: cls._load_folder(f, backend=backend, device=device, approximate=approximate)
        )

    @classmethod
    def _load_folder(
        cls, folder: Path, *, backend: Backend | None, device: str | torch.device, approximate: Approximate | None
    ) -> EmbeddingIndex:
        if not folder.is_dir():
            raise ModelFileError(f"{folder} is not a folder; an index is a folder written by EmbeddingIndex.save")
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
        file = folder / INDEX_EMBEDDINGS
        if not file.is_file():
            raise ModelFileError(f"{file} is missing: the index folder is incomplete")
        if sha256_file(file) != config.get("files", {}).get(INDEX_EMBEDDINGS):
            raise ModelFileError(f"{file} does not match its checksum: it is truncated, corrupted or edited")
        try:
            matrix = load_arrays(file)["embeddings"]
            ids, texts, dim = config["ids"], config["texts"], int(config["dim"])
            if matrix.ndim != 2 or matrix.shape != (int(config["count"]), dim) or len(ids) != len(matrix):
                raise ValueError(f"embeddings of shape {matrix.shape} for {len(ids)} ids and dim {dim}")
            if texts is not None and len(texts) != len(ids):
                raise ValueError(f"{len(texts)} texts for {len(ids)} ids")
            chosen = backend or config.get("backend", "torch")
            if backend is None and chosen == "faiss" and not faiss_available():
                # Same files, same exact results: an index saved with faiss stays usable where faiss is absent.
                logger.warning("%s was saved with the faiss backend, which is not installed; using torch", folder)
                chosen = "torch"
            # Indexes saved before approximate search existed are exact.
            kind = approximate or config.get("approximate", "exact")
            ann_params = config.get("ann_params") or {}
            if approximate is None and kind in ("hnsw", "ivf") and not faiss_available():
                # Same vectors, exact answers (a superset of what the approximate search finds), only slower.
                logger.warning(
                    "%s was saved for %s search, which needs faiss (not installed); searching exactly", folder, kind
                )
                kind = "exact"
            index = cls(dim, metric=config["metric"], backend=chosen, device=device, approximate=kind, **ann_params)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFileError(f"{folder} is inconsistent ({type(e).__name__}: {e}); was it edited?") from None
        index.model = config.get("model")
        local = config.get("model_local_path")
        # A local model is recorded relative to the index folder: the two folders may move together.
        index.model_source = str((folder / local).resolve()) if local else config.get("model_source")
        # The stored rows are already prepared (normalised for cosine); add them as they are.
        index._add_prepared(matrix.astype(np.float32), _check_ids(ids, len(ids), set()), texts)
        index.recall = config.get("recall")
        index._load_ann(folder, config)
        return index

    def _load_ann(self, folder: Path, config: dict[str, Any]) -> None:
        """Reuse the saved faiss index (checked against its sha256) when this index searches with the same kind."""
        saved = config.get("ann_file")
        if not saved:
            return
        file = folder / INDEX_ANN
        if not file.is_file() or sha256_file(file) != config.get("files", {}).get(INDEX_ANN):
            raise ModelFileError(
                f"{file} is missing or does not match its checksum: it is truncated, corrupted or edited"
            )
        if not faiss_available() or self.search_kind() != saved["kind"]:
            return
        import faiss

        try:
            ann = faiss.read_index(str(file))
        except RuntimeError as e:  # written by a faiss this one cannot read: the vectors are enough to rebuild it
            logger.warning("%s cannot be read by this faiss (%s); it is rebuilt from the vectors", file, e)
            return
        if ann.ntotal != len(self) or ann.d != self.dim:
            raise ModelFileError(f"{file} holds {ann.ntotal} x {ann.d} vectors, not {len(self)} x {self.dim}")
        self._ann = (saved["kind"], ann)

    def _add_prepared(self, matrix: np.ndarray, ids: list[ItemId], texts: list[str] | None) -> None:
        block = torch.from_numpy(np.ascontiguousarray(matrix))
        self._blocks.append(block.to(self.device))
        if self._faiss is not None and len(matrix):
            self._faiss.add(block.numpy())
        self.ids, self._id_set, self.texts = ids, set(ids), texts
