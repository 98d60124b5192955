"""Top-k over stored float32 rows [N, D] (unit rows for cosine), exact or approximate: :class:`VectorSearch`.

Exact search runs in torch blocks (memory stays one block whatever N) or a faiss flat index; an approximate one
(faiss HNSW or IVF) is built from the rows at the first query after rows were added. ``"auto"`` chooses HNSW only
where its measured recall reaches :data:`AUTO_MIN_RECALL`: calibrated embeddings are close to isotropic, the hard
case for HNSW, so a fixed switch could silently lose most true neighbours.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Literal, get_args

import numpy as np
import torch

from ..errors import CompatibilityError, InputError
from ..linalg import unit_rows
from ..validation import check_finite, check_positive_int

logger = logging.getLogger(__name__)

Metric = Literal["cosine", "dot"]
Backend = Literal["torch", "faiss"]
#: The backends, as the CLI lists and checks them.
BACKENDS: tuple[str, ...] = get_args(Backend)
Approximate = Literal["auto", "exact", "hnsw", "ivf"]
APPROXIMATE_KINDS: tuple[str, ...] = get_args(Approximate)

#: ``approximate="auto"`` searches exactly below this many rows (an exact query then takes a few milliseconds on a
#: CPU, and recall below 1 buys little), and from it on considers HNSW.
AUTO_APPROXIMATE_MIN_ROWS = 100_000
#: ``approximate="auto"`` chooses HNSW only when its measured recall@10 reaches this (else it searches exactly).
AUTO_MIN_RECALL = 0.95
#: Rows drawn (seeded) as held-out queries by :meth:`VectorSearch.measure_recall`.
RECALL_SAMPLE = 500


def faiss_available() -> bool:
    """Whether the optional ``faiss`` package (``faiss-cpu``) is installed."""
    return importlib.util.find_spec("faiss") is not None


def import_faiss(
    what: str = "backend 'faiss'", alternative: str = "backend='torch', which gives the same exact results"
) -> Any:
    """The ``faiss`` module, or an InputError saying that ``what`` needs it and to use ``alternative``."""
    try:
        import faiss
    except ImportError:
        raise InputError(
            f"{what} needs the faiss package: pip install faiss-cpu (or bertflow[faiss]); or use {alternative}"
        ) from None
    return faiss


def _by_score_then_row(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic order among equal scores (block merging and faiss do not guarantee one): by row."""
    order = np.lexsort((rows, -scores), axis=-1)
    return np.take_along_axis(scores, order, -1), np.take_along_axis(rows, order, -1).astype(np.int64)


class VectorSearch:
    """Top-k search over rows of dimension ``dim`` (module docstring). ``metric``: ``"cosine"`` (rows and queries
    L2-normalised; bertflow's similarity) or ``"dot"``; ``backend``: exact search by ``"torch"`` (on ``device``, in
    blocks of ``query_chunk_size`` x ``corpus_chunk_size`` that do not change results) or ``"faiss"``;
    ``approximate``: ``"auto"``, ``"exact"``, ``"hnsw"`` or ``"ivf"`` (the last two need faiss). HNSW: ``hnsw_m``
    links per node, ``ef_search`` candidates per query (at least ``k``), ``ef_construction`` while inserting (faiss
    ``M``, ``efSearch``, ``efConstruction``); IVF: ``nlist`` lists (``None``: ``round(sqrt(N))`` at build time),
    ``nprobe`` visited per query."""

    def __init__(
        self,
        dim: int,
        *,
        metric: Metric = "cosine",
        backend: Backend = "torch",
        device: str | torch.device = "cpu",
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
        self.ann_params: dict[str, int | None] = {
            "hnsw_m": hnsw_m,
            "ef_search": ef_search,
            "ef_construction": ef_construction,
            "nlist": nlist,
            "nprobe": nprobe,
        }
        for name, value in self.ann_params.items():
            check_positive_int(name, 1 if value is None and name == "nlist" else value)  # nlist None: sqrt(N)
        if approximate in ("hnsw", "ivf"):
            import_faiss(f"approximate={approximate!r}", "approximate='exact'")
        self.dim = int(dim)
        self.metric: Metric = metric
        self.backend: Backend = backend
        self.device = torch.device(device)
        self.query_chunk_size = int(query_chunk_size)
        self.corpus_chunk_size = int(corpus_chunk_size)
        self.approximate: Approximate = approximate
        # Added blocks are concatenated lazily: appending to one tensor per add() would copy O(N^2) bytes.
        self._blocks: list[torch.Tensor] = []
        self._matrix = torch.empty((0, self.dim), dtype=torch.float32, device=self.device)
        self._rows = 0
        # The approximate faiss index over all rows, (kind, index), built at the first query after an add.
        self._ann: Any = None
        #: The last recall measurement (:meth:`measure_recall`) for the current rows, or ``None``.
        self.recall: dict[str, Any] | None = None
        self._auto_noted = False
        self._faiss: Any = import_faiss().IndexFlatIP(self.dim) if backend == "faiss" else None

    def __len__(self) -> int:
        return self._rows

    def _vectors(self, x: object, what: str) -> np.ndarray:
        """``x`` as float32 [n, dim], checked."""
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

    def _prepare(self, arr: np.ndarray) -> np.ndarray:
        """float32 C-contiguous rows, L2-normalised for cosine (zero rows stay zero and score 0)."""
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        return np.ascontiguousarray(unit_rows(arr), dtype=np.float32) if self.metric == "cosine" else arr

    def _append(self, prepared: np.ndarray) -> None:
        """Add rows already prepared (:meth:`_prepare`); the approximate index and the recall are then stale."""
        block = torch.from_numpy(np.ascontiguousarray(prepared, dtype=np.float32))
        self._blocks.append(block.to(self.device))
        if self._faiss is not None and len(block):
            self._faiss.add(block.numpy())
        self._rows += len(block)
        self._ann = None
        self.recall = None

    def _corpus(self) -> torch.Tensor:
        if self._blocks:
            self._matrix = torch.cat([self._matrix, *self._blocks])
            self._blocks = []
        return self._matrix

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
        (it would be a free hit). Sets and returns :attr:`recall`: ``{"kind", "k", "recall_at_k", "sample", "rows",
        "min_recall"}`` (recall in [0, 1])."""
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
        recall = round(float(np.mean(hits)), 4)
        self.recall = {"kind": kind, "k": int(k), "recall_at_k": recall, "sample": len(picked), "rows": n}
        self.recall["min_recall"] = AUTO_MIN_RECALL
        logger.info("%s search: recall@%d %.3f on %d held-out rows of %d", kind, k, recall, len(picked), n)
        return self.recall

    def _ann_index(self, kind: str) -> Any:
        """The faiss HNSW or IVF index over the current rows (inner product), built once per set of rows."""
        if self._ann is not None and self._ann[0] == kind:
            return self._ann[1]
        faiss = import_faiss(f"approximate={kind!r}", "approximate='exact'")
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

    def topk(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best rows (capped at the index size) for each of the float [M, D] ``queries`` (normalised here
        for cosine): ``(scores, rows)``, float32 [M, k'] best first and int64 [M, k'] row positions,
        ``k' = min(k, len(self))``. Equal scores are ordered by row; which of several rows tied at the k-th place is
        kept is unspecified. An approximate search (:meth:`search_kind`) may miss true neighbours, and marks places
        it could not fill with row ``-1`` and score ``-inf``."""
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
        ann = self._ann_index(kind)
        if kind == "hnsw":
            ann.hnsw.efSearch = max(int(self.ann_params["ef_search"]), k)
        else:
            ann.nprobe = min(int(self.ann_params["nprobe"]), ann.nlist)
        scores, rows = ann.search(q, k)
        return _by_score_then_row(np.where(rows < 0, -np.inf, scores).astype(np.float32), rows)

    def _exact_topk(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self._faiss is not None:
            return _by_score_then_row(*self._faiss.search(q, k))
        return _by_score_then_row(*self._torch_topk(torch.from_numpy(q), k))

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
