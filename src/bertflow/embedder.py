"""Embedder: a frozen encoder joined with a fitted calibrator; fit, encode, compare, save and load.

A saved folder::

    my-model/
      bertflow_config.json      encoder (id, revision pinned to a hub commit, pooling, max_length, fingerprint,
                                provenance: commit or weight files' sha256), calibrator type,
                                fitting record, library version, sha256 of every other file
      calibrator/config.json    calibrator parameters and fitted scalars
      calibrator/model.safetensors
      README.md                 model card (YAML front matter for the Hugging Face Hub): how it was fitted
      encoder/                  only with ``save(..., include_encoder=True)``: the encoder's own HF files
                                (config, safetensors weights, tokenizer, its README/licence)

By default the encoder's weights are referenced by id (or path) and revision, not copied; with
``include_encoder=True`` the folder is self-contained and loading uses the copy. Either way the folder is a
complete Hugging Face-style repository that ``huggingface_hub.upload_folder`` can publish as is, and
:meth:`Embedder.load` takes the folder or its hub id. Loading re-checks everything: checksums, format version, the
encoder's fingerprint and dimension against the calibrator's.

The Embedder also searches: :meth:`Embedder.build_index` embeds a corpus into an
:class:`~bertflow.search.EmbeddingIndex` and :meth:`Embedder.search` queries it; a saved index records this
model's :meth:`Embedder.identity` and is refused by any other model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ._version import __version__
from .calibrators import Calibrator, FlowCalibrator, IdentityCalibrator
from .encoding.encoder import SentenceEncoder, fingerprint_hint, resolve_model
from .errors import CompatibilityError, InputError, ModelFileError
from .io.files import FOLDER_KINDS, OLD_MARK, atomic_directory, check_output_folder, read_consistent
from .io.formats import FORMAT_VERSION, read_json, sha256_file, write_json
from .linalg import unit_rows
from .validation import is_blank, validate_sentences

if TYPE_CHECKING:
    from .search import EmbeddingIndex, SearchHit

__all__ = ["Embedder", "CONFIG_FILE", "calibrator_fingerprint", "corpus_digest", "device_transform", "iter_calibrated"]

logger = logging.getLogger(__name__)

CONFIG_FILE = FOLDER_KINDS["model"][0]  # "bertflow_config.json"
CALIBRATOR_DIR = "calibrator"
ENCODER_DIR = "encoder"

#: Files of a Hugging Face checkpoint that ``save(include_encoder=True)`` copies: config, weights, tokenizer, and
#: the model's own card and licence (its terms travel with its weights). Other formats (ONNX, OpenVINO, TF) are
#: left out; ``pytorch_model.bin`` only when there is no safetensors file.
ENCODER_FILE_PATTERNS = (
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",
    "README.md",
    "LICENSE*",
)
_TORCH_BIN_PATTERNS = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")

# Parameters that change how a calibrator runs, not what it computes: left out of its fingerprint.
_RUNTIME_KEYS = frozenset({"bertflow_version", "format_version", "fitted_on", "verbose", "device"})


def corpus_digest(sentences: Sequence[str]) -> str:
    """sha256 of the sentences joined by newlines: identifies a fitting corpus without storing it."""
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def calibrator_fingerprint(calibrator: Calibrator) -> str:
    """A short hash of a fitted calibrator's type, parameters and fitted state (arrays included).

    Identical for the same calibrator before saving and after loading, on CPU or GPU, in any bertflow version;
    different as soon as one fitted number differs. Runtime settings (``device``, ``verbose``) are left out.
    """

    def canonical(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: canonical(v) for k, v in value.items() if k not in _RUNTIME_KEYS}
        if isinstance(value, (list, tuple)):
            return [canonical(v) for v in value]
        return value

    config = calibrator.to_config()
    _, arrays = calibrator._get_state()
    h = hashlib.sha256(json.dumps(canonical(config), sort_keys=True, default=str).encode("utf-8"))
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


def device_transform(
    encoder: SentenceEncoder, calibrator: Calibrator | None
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``calibrator`` as a float32 function on ``encoder``'s device (:meth:`Calibrator.torch_transform`), for the
    encoder to apply to pooled vectors before they leave the device; ``None`` for no calibrator."""
    return None if calibrator is None else calibrator.torch_transform(encoder.device)


def iter_calibrated(
    encoder: SentenceEncoder,
    calibrator: Calibrator | None,
    sentences: Iterable[str],
    *,
    batch_size: int | None = None,
    chunk_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[np.ndarray]:
    """The encode-then-calibrate loop: float32 [n, D'] chunks of calibrated embeddings, in input order.

    Every calibrated stream in bertflow goes through here (:meth:`Embedder.iter_encode`, ``bertflow encode``, the
    scale-out store writer): the encoder's one forward pass (:meth:`SentenceEncoder.iter_encode`), the calibrator
    applied on the device in float32 before the copy to the host, and the NaN/Inf and overflow checks done once,
    there (naming the stream row). :meth:`Embedder.encode` is the same path for a list held in memory.

    Args:
        encoder: the frozen encoder.
        calibrator: a fitted calibrator, or ``None`` for the raw pooled vectors.
        sentences: any iterable of non-blank strings (a list, a file reader).
        batch_size, chunk_size, progress: as in :meth:`SentenceEncoder.iter_encode`.
    """
    yield from encoder.iter_encode(
        sentences,
        batch_size=batch_size,
        chunk_size=chunk_size,
        transform=device_transform(encoder, calibrator),
        progress=progress,
    )


class Embedder:
    """Sentence encoder + calibrator, with SimCSE's small surface: ``fit``, ``encode``, ``similarity``.

    Args:
        encoder: the frozen encoder; ``None`` builds the embedded default (all-MiniLM-L6-v2, mean pooling).
        calibrator: an unfitted or fitted calibrator; ``None`` uses BERT-flow (:class:`FlowCalibrator`).

    Attributes:
        index: the :class:`~bertflow.search.EmbeddingIndex` that :meth:`search` uses, set by :meth:`build_index`
            or :meth:`load_index` (``None`` before).
        source: the folder or hub id this model was loaded from or last saved to (``None`` otherwise).

    Example:
        >>> emb = Embedder().fit(open("corpus.txt").read().splitlines())
        >>> emb.similarity("A man plays guitar.", "Someone plays an instrument.")
        0.71
        >>> emb.save("my-flow"); Embedder.load("my-flow").encode("hello").shape
        (384,)
        >>> emb.build_index(["A man plays guitar.", "The cat sleeps."])
        >>> emb.search("someone making music", top_k=1)
        [SearchHit(id=0, score=0.62, text='A man plays guitar.', row=0)]
    """

    def __init__(self, encoder: SentenceEncoder | None = None, calibrator: Calibrator | None = None) -> None:
        self.encoder = encoder if encoder is not None else SentenceEncoder()
        self.calibrator = calibrator if calibrator is not None else FlowCalibrator()
        self.fit_info: dict[str, Any] = {}
        self.index: EmbeddingIndex | None = None
        self.source: str | None = None
        # Local folder holding the encoder's HF files when loaded from a self-contained save (copied on re-save).
        self._encoder_dir: Path | None = None
        if self.calibrator.is_fitted:
            self._check_compatible(self.calibrator, getattr(self.calibrator, "fitted_on", None))

    def _check_compatible(self, calibrator: Calibrator, fitted_on: dict[str, Any] | None) -> None:
        if calibrator.n_features_in_ != self.encoder.dim:
            raise CompatibilityError(
                f"the calibrator was fitted on {calibrator.n_features_in_}-dimensional embeddings, but "
                f"{self.encoder.model_id} gives {self.encoder.dim}; refit it for this encoder"
            )
        if fitted_on:
            ours = self.encoder.get_config()
            for key in ("fingerprint", "pooling", "max_length"):
                if key in fitted_on and fitted_on[key] != ours[key]:
                    hint = fingerprint_hint(fitted_on[key]) if key == "fingerprint" else ""
                    raise CompatibilityError(
                        f"the calibrator was fitted with {key}={fitted_on[key]!r} (encoder {fitted_on.get('model')}),"
                        f" but this encoder has {key}={ours[key]!r}; refit it or load the matching encoder{hint}"
                    )

    # -- fit / encode / similarity -----------------------------------------------------------------------

    def fit(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        regime: str = "custom",
    ) -> Embedder:
        """Encode ``sentences`` (no labels) and fit the calibrator on them. Returns ``self``.

        Args:
            sentences: the unlabeled fitting corpus (duplicates are kept: they weight the density).
            regime: a free-form label saved in the model card (``"target"``, ``"nli"``, ``"corpus"``...).
        """
        items = validate_sentences(sentences)
        started = time.perf_counter()
        X = self.encoder.encode(items, batch_size=batch_size, show_progress_bar=show_progress_bar)
        self.fit_embeddings(X)
        self.fit_info = {
            "n_sentences": len(items),
            "corpus_sha256": corpus_digest(items),
            "regime": regime,
            "seconds": round(time.perf_counter() - started, 2),
            "fitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{platform.machine()} {platform.system()}, device {self.encoder.device}",
        }
        return self

    def fit_embeddings(self, X: np.ndarray) -> Embedder:
        """Fit the calibrator on embeddings already produced by this encoder (e.g. from a cache)."""
        self.calibrator.fit(X)
        self.calibrator.fitted_on = self.encoder.get_config()
        return self

    def encode(
        self, sentences: str | Sequence[str], *, batch_size: int | None = None, show_progress_bar: bool | None = None
    ) -> np.ndarray:
        """Calibrated embeddings: float32 [N, D'] (or [D'] for one string).

        The calibrator runs on the encoder's device, on each chunk of pooled vectors before they are copied to
        the host (:meth:`Calibrator.torch_transform`, float32), so calibration costs next to nothing on a GPU.
        """
        self._require_fitted()
        return self.encoder.encode(
            sentences, batch_size=batch_size, show_progress_bar=show_progress_bar, transform=self._device_transform()
        )

    def _device_transform(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return device_transform(self.encoder, self.calibrator)

    def similarity(self, a: str | Sequence[str], b: str | Sequence[str]) -> float | np.ndarray:
        """Cosine similarity in the calibrated space.

        Returns:
            a float for two strings, else a float32 matrix [len(a), len(b)] (a string counts as one row).
        """
        za = np.atleast_2d(self.encode(a)).astype(np.float64)
        zb = np.atleast_2d(self.encode(b)).astype(np.float64)
        sims = unit_rows(za) @ unit_rows(zb).T
        if isinstance(a, str) and isinstance(b, str):
            return float(sims[0, 0])
        return sims.astype(np.float32)

    def similarity_pairwise(
        self, a: Sequence[str], b: Sequence[str], *, show_progress_bar: bool | None = None
    ) -> np.ndarray:
        """Cosine of each pair ``(a[i], b[i])``: float32 [N]. ``show_progress_bar`` as in :meth:`encode`."""
        if len(a) != len(b):
            raise ValueError(f"need as many first as second sentences, got {len(a)} and {len(b)}")
        from tqdm.auto import tqdm

        self._require_fitted()
        transform = self._device_transform()
        show = 2 * len(a) >= 4096 if show_progress_bar is None else show_progress_bar
        # One bar over both sides, moving per forward batch on CPU (SentenceEncoder.iter_encode's progress).
        with tqdm(total=2 * len(a), desc="similarity", unit="sent", disable=not show) as bar:
            za, zb = (
                unit_rows(
                    self.encoder.encode(
                        list(side), show_progress_bar=False, transform=transform, progress=bar.update
                    ).astype(np.float64)
                )
                for side in (a, b)
            )
        return (za * zb).sum(axis=1).astype(np.float32)

    def _require_fitted(self) -> None:
        if not self.calibrator.is_fitted:
            if isinstance(self.calibrator, IdentityCalibrator):
                self.calibrator.fit(np.zeros((1, self.encoder.dim)))
                return
            self.calibrator._check_fitted()

    # -- identity and search -----------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What makes this model's vectors what they are: the encoder config (with its weight fingerprint) and the
        calibrator's type, fingerprint and output dimension. Saved with an index and compared when it is used."""
        self._require_fitted()
        return {
            "encoder": self.encoder.get_config(),
            "calibrator": {
                "type": self.calibrator.name,
                "fingerprint": calibrator_fingerprint(self.calibrator),
                "dim": int(self.calibrator.n_features_out_),
            },
        }

    def iter_encode(
        self, sentences: Sequence[str], *, batch_size: int | None = None, show_progress_bar: bool | None = None
    ) -> Iterator[np.ndarray]:
        """Calibrated embeddings of ``sentences`` in chunks (float32 [<=16384, D']), in order, with a progress bar.

        Memory stays bounded by one chunk, so corpora larger than what :meth:`encode` should hold at once stream
        straight into an index.
        """
        from tqdm.auto import tqdm

        self._require_fitted()
        show = len(sentences) >= 4096 if show_progress_bar is None else show_progress_bar
        with tqdm(total=len(sentences), desc="encode", unit="sent", disable=not show) as bar:
            yield from iter_calibrated(
                self.encoder, self.calibrator, sentences, batch_size=batch_size, progress=bar.update
            )

    def build_index(
        self,
        corpus: Sequence[str],
        ids: Sequence[str | int] | None = None,
        *,
        backend: Literal["torch", "faiss"] = "torch",
        device: str = "cpu",
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        approximate: Literal["auto", "exact", "hnsw", "ivf"] = "auto",
    ) -> EmbeddingIndex:
        """Embed ``corpus`` into a new cosine :class:`~bertflow.search.EmbeddingIndex` that :meth:`search` will use.

        Args:
            corpus: the sentences to search (a list; for a file use :meth:`build_index_from_file`).
            ids: one str or int id per sentence, unique; default: positions 0..N-1.
            backend: ``"torch"`` (exact, blockwise) or ``"faiss"`` (exact ``IndexFlatIP``; needs ``faiss-cpu``).
            device: where the index keeps its vectors and computes scores.
            approximate: ``"auto"`` (exact below ``search.AUTO_APPROXIMATE_MIN_ROWS`` rows, else HNSW when faiss is
                installed), ``"exact"``, ``"hnsw"`` or ``"ivf"``; see :class:`~bertflow.search.EmbeddingIndex`.
            show_progress_bar: ``None`` shows one for 4,096 sentences or more.

        Returns:
            the index (also stored as :attr:`index`); ``index.save(path)`` writes it with this model's identity.
        """
        from .search import EmbeddingIndex

        if isinstance(corpus, str):
            raise InputError("build_index takes a list of sentences; to index a file use build_index_from_file(path)")
        items = validate_sentences(corpus)
        if not items:
            raise InputError("the corpus is empty: nothing to index")
        index = EmbeddingIndex(
            self.calibrator_dim(), backend=backend, device=device, model=self.identity(), approximate=approximate
        )
        index.model_source = self.source
        self.index = index
        self.add_to_index(items, ids, batch_size=batch_size, show_progress_bar=show_progress_bar)
        logger.info("indexed %d sentences (%s backend)", len(index), backend)
        return index

    def build_index_from_file(
        self,
        path: str | Path,
        *,
        column: str | int | None = None,
        unique: bool = False,
        errors: Literal["strict", "replace"] = "strict",
        **kwargs: Any,
    ) -> EmbeddingIndex:
        """:meth:`build_index` on a UTF-8 file: one sentence per line, or one ``column`` of a TSV with a header.

        Ids are 1-based line numbers for a text file and 1-based data-row numbers for a TSV. ``unique`` drops
        repeated sentences (keeping the first); ``kwargs`` go to :meth:`build_index`.
        """
        from .io.text import iter_lines, read_tsv_column

        if column is None:
            rows = [(number, text) for number, text in iter_lines(path, errors=errors) if not is_blank(text)]
        else:
            rows = list(enumerate(read_tsv_column(path, column, errors=errors), start=1))
        if unique:
            first: dict[str, int] = {}
            for number, text in rows:
                first.setdefault(text, number)
            rows = [(number, text) for text, number in first.items()]
        if not rows:
            raise InputError(f"no sentences in {path}")
        return self.build_index([t for _, t in rows], [n for n, _ in rows], **kwargs)

    def add_to_index(
        self,
        sentences: Sequence[str],
        ids: Sequence[str | int] | None = None,
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> None:
        """Embed ``sentences`` and append them to :attr:`index` (with their texts), streaming chunk by chunk."""
        index = self._require_index()
        items = validate_sentences(sentences)
        if ids is not None and len(ids) != len(items):
            raise InputError(f"got {len(ids)} ids for {len(items)} sentences; give one id per sentence")
        start = 0
        for part in self.iter_encode(items, batch_size=batch_size, show_progress_bar=show_progress_bar):
            stop = start + len(part)
            index.add(part, None if ids is None else list(ids[start:stop]), items[start:stop])
            start = stop

    def load_index(self, path: str | Path, *, backend: Literal["torch", "faiss"] | None = None) -> EmbeddingIndex:
        """Load an index saved by ``EmbeddingIndex.save`` for :meth:`search`, refusing one built by another model.

        Raises:
            CompatibilityError: the index was built with another encoder, pooling, truncation or calibrator.
        """
        from .search import EmbeddingIndex

        index = EmbeddingIndex.load(path, backend=backend)
        index.check_model(self.identity())
        self.index = index
        return index

    def search(
        self,
        queries: str | Sequence[str],
        top_k: int = 10,
        *,
        index: EmbeddingIndex | None = None,
        show_progress_bar: bool | None = None,
    ) -> list[SearchHit] | list[list[SearchHit]]:
        """The ``top_k`` corpus sentences closest to each query (cosine in the calibrated space).

        Args:
            queries: one sentence, or a list of them.
            top_k: hits per query.
            index: search this index instead of :attr:`index` (checked against this model first).
            show_progress_bar: for embedding the queries, as in :meth:`encode`.

        Returns:
            for one string, a list of :class:`~bertflow.search.SearchHit` (``id``, ``score``, ``text``, ``row``),
            best first; for a list, one such list per query.

        Raises:
            InputError: no index built or loaded yet.
            CompatibilityError: the index was built with another model.
        """
        target = index if index is not None else self._require_index()
        target.check_model(self.identity())
        return target.search(self.encode(queries, show_progress_bar=show_progress_bar), top_k=top_k)

    def calibrator_dim(self) -> int:
        """Dimension D' of the calibrated vectors."""
        self._require_fitted()
        return int(self.calibrator.n_features_out_)

    def _require_index(self) -> EmbeddingIndex:
        if self.index is None:
            raise InputError("no index to search: call build_index(corpus) or load_index(path) first, or pass index=")
        return self.index

    # -- persistence -------------------------------------------------------------------------------------

    def save(self, path: str | Path, *, include_encoder: bool = False, overwrite: bool = False) -> Path:
        """Write the folder described in the module docstring, atomically. Returns its path.

        Args:
            path: the folder: new, empty, or (with ``overwrite``) a bertflow model, replaced whole; a crash at
                any point leaves the old one in place.
            include_encoder: also copy the encoder's Hugging Face files into ``encoder/`` so the folder is
                self-contained (a hub repo that needs nothing else); loading then uses that copy.
            overwrite: replace a bertflow model already at ``path``. Since bertflow 0.x an existing model is
                refused without it, and any other non-empty folder (or the working directory) always is.

        Raises:
            OutputError: ``path`` may not be written (see :func:`~bertflow.io.files.check_output_folder`).
        """
        self._require_fitted()
        check_output_folder(path, "model", overwrite=overwrite)
        with atomic_directory(path) as tmp:
            self.calibrator.save(tmp / CALIBRATOR_DIR)
            encoder_config = self._pinned_encoder_config()
            if include_encoder:
                copied = self._copy_encoder_files(tmp / ENCODER_DIR)
                encoder_config["path"] = ENCODER_DIR
                logger.info("copied %d encoder file(s) into %s", copied, Path(path) / ENCODER_DIR)
            (tmp / "README.md").write_text(self.model_card(include_encoder=include_encoder), encoding="utf-8")
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            config = {
                "library": "bertflow",
                "bertflow_version": __version__,
                "format_version": FORMAT_VERSION,
                "encoder": encoder_config,
                "calibrator": {"type": self.calibrator.name, "path": CALIBRATOR_DIR},
                "fitting": self.fit_info,
                "files": {
                    p.relative_to(tmp).as_posix(): sha256_file(p)
                    for p in files
                    # The model card is for people and may be edited on the hub; it carries no numbers we use.
                    if p.relative_to(tmp).as_posix() != "README.md"
                },
            }
            write_json(tmp / CONFIG_FILE, config)
        self.source = str(Path(path).expanduser().resolve())
        logger.info("saved %r to %s", self, path)
        return Path(path)

    def _copy_encoder_files(self, dest: Path) -> int:
        """Copy the encoder's HF checkpoint files (see :data:`ENCODER_FILE_PATTERNS`) into ``dest``."""
        source = self._encoder_dir
        if source is None:
            _, load_path = resolve_model(self.encoder.model_id)
            source = Path(load_path)
            if not source.is_dir():
                # The commit the encoder was loaded from, not a branch that may have moved since.
                revision = self.encoder.provenance().get("commit") or self.encoder.revision
                source = _snapshot(load_path, revision, allow_patterns=[*ENCODER_FILE_PATTERNS])
        files = {p for pattern in ENCODER_FILE_PATTERNS for p in source.glob(pattern) if p.is_file()}
        if not any(p.suffix == ".safetensors" for p in files):
            files |= {p for pattern in _TORCH_BIN_PATTERNS for p in source.glob(pattern) if p.is_file()}
        if not any(p.name == "config.json" for p in files):
            raise ModelFileError(
                f"cannot copy the encoder: {source} has no config.json, so it is not a Hugging Face checkpoint; "
                "save without include_encoder"
            )
        dest.mkdir(parents=True)
        for file in sorted(files):
            shutil.copy2(file, dest / file.name)
        return len(files)

    @classmethod
    def load(
        cls, path: str | Path, *, device: str | None = None, dtype: str = "auto", revision: str | None = None
    ) -> Embedder:
        """Load a folder written by :meth:`save`, or a Hugging Face Hub repo id holding one.

        Args:
            path: a local folder, or a hub repo id (``"user/my-flow"``; fetched and cached by huggingface_hub).
            device, dtype: for the encoder, as in :class:`~bertflow.encoding.encoder.SentenceEncoder`.
            revision: hub revision (branch, tag or commit) of the bertflow repo.

        Raises:
            ModelFileError: missing, truncated, corrupted or edited files; a path that is neither a local folder
                nor a hub repo that can be fetched (e.g. offline and not cached).
            CompatibilityError: a newer format, or a calibrator that does not match the encoder.
        """
        folder = Path(path).expanduser()
        if not (folder.is_dir() or _left_by_interrupted_save(folder)):
            folder = _download(str(path), revision)
            config, calibrator = cls._read_folder(folder)
            return cls._assemble(folder, config, calibrator, str(path), device=device, dtype=dtype)

        def read(f: Path) -> Embedder | tuple[dict[str, Any], Calibrator]:
            config, calibrator = cls._read_folder(f)
            if _bundles_encoder(config):  # its weights are files of the folder too: read them in the same snapshot
                return cls._assemble(f, config, calibrator, str(f.resolve()), device=device, dtype=dtype)
            return config, calibrator

        # Another process may save over the folder while it is read: the folder's files are read again until one
        # read saw a single complete save (the encoder, loaded from elsewhere, is built once, afterwards).
        result = read_consistent(folder, CONFIG_FILE, read)
        if isinstance(result, Embedder):
            return result
        config, calibrator = result
        return cls._assemble(folder, config, calibrator, str(folder.resolve()), device=device, dtype=dtype)

    @classmethod
    def _read_folder(cls, folder: Path) -> tuple[dict[str, Any], Calibrator]:
        """The config (format and checksums verified) and the calibrator of the model folder ``folder``."""
        config = read_json(folder / CONFIG_FILE)
        if config.get("library") != "bertflow":
            raise ModelFileError(f"{folder / CONFIG_FILE} is not a bertflow model config")
        version = config.get("format_version")
        if not isinstance(version, int):
            raise ModelFileError(f"{folder / CONFIG_FILE} has no valid format_version; was it edited?")
        if version > FORMAT_VERSION:
            raise CompatibilityError(
                f"{folder} was written by bertflow {config.get('bertflow_version')} (format {version}); "
                f"this is bertflow {__version__} (format {FORMAT_VERSION}): upgrade bertflow to load it"
            )
        encoder_dir: Path | None = None
        try:
            calibrator_dir = _inside(folder, config["calibrator"]["path"], "calibrator.path")
            if config["encoder"].get("path"):
                encoder_dir = _inside(folder, config["encoder"]["path"], "encoder.path")
        except (KeyError, TypeError, AttributeError) as e:
            raise ModelFileError(f"{folder / CONFIG_FILE} lacks or garbles {e}; was it edited?") from None
        _verify_files(folder, config.get("files"), [calibrator_dir, *([encoder_dir] if encoder_dir else [])])
        return config, Calibrator.load(calibrator_dir)

    @classmethod
    def _assemble(
        cls,
        folder: Path,
        config: dict[str, Any],
        calibrator: Calibrator,
        source: str,
        *,
        device: str | None,
        dtype: str,
    ) -> Embedder:
        """The embedder of a model folder read by :meth:`_read_folder`; ``source`` is recorded as its origin."""
        encoder_dir: Path | None = None
        try:
            enc = config["encoder"]
            if enc.get("path"):
                encoder_dir = _inside(folder, enc["path"], "encoder.path")
            if encoder_dir is not None:
                # A self-contained folder: load the copy, but keep the original id and revision as provenance.
                if not (encoder_dir / "config.json").is_file():
                    raise ModelFileError(f"{encoder_dir} has no config.json: the bundled encoder is incomplete")
                encoder = SentenceEncoder.from_config({**enc, "model": str(encoder_dir)}, device=device, dtype=dtype)
                encoder.model_id, encoder.revision = enc["model"], enc.get("revision")
                encoder._provenance = {k: enc[k] for k in _PROVENANCE_KEYS if k in enc}
            else:
                encoder = SentenceEncoder.from_config(enc, device=device, dtype=dtype)
        except (KeyError, TypeError, AttributeError) as e:
            raise ModelFileError(f"{folder / CONFIG_FILE} lacks or garbles {e}; was it edited?") from None
        # The constructor compares the encoder actually loaded with what the calibrator was fitted on
        # (fingerprint, pooling, max_length, dimension), so an edited config or a swapped encoder is refused.
        embedder = cls(encoder, calibrator)
        embedder.fit_info = config.get("fitting", {})
        embedder.source = source
        embedder._encoder_dir = encoder_dir
        return embedder

    def _pinned_encoder_config(self) -> dict[str, Any]:
        """The encoder's config as saved: with its provenance (:meth:`SentenceEncoder.provenance`), and for a hub
        checkpoint ``revision`` pinned to the commit it was loaded from (the revision asked for, a branch or tag
        that may move, is kept as ``requested_revision``), so that loading the saved model gets the same files."""
        config = self.encoder.get_config()
        provenance = self.encoder.provenance()
        commit = provenance.get("commit")
        if commit and config.get("revision") != commit:
            if config.get("revision"):
                config["requested_revision"] = config["revision"]
            config["revision"] = commit
        return {**config, **provenance}

    def encoder_license(self) -> str | None:
        """The encoder's licence identifier as its own files declare it (``license:`` in its README's front
        matter, else a ``license`` key in its config.json), or ``None`` where neither is at hand."""
        folder = self._encoder_dir or self.encoder.source_dir
        if folder is None:
            return None
        readme, config = folder / "README.md", folder / "config.json"
        if readme.is_file():
            text = readme.read_text(encoding="utf-8", errors="replace")
            front = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---", text, re.S)
            found = front and re.search(r"^license:[ \t]*['\"]?([\w.+-]+)['\"]?[ \t]*$", front.group(1), re.M)
            if found:
                return found.group(1)
        if config.is_file():
            try:
                value = json.loads(config.read_text(encoding="utf-8")).get("license")
            except (ValueError, AttributeError):
                value = None
            if isinstance(value, str) and value.strip():
                return value.strip()
        return None

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        commit_message: str = "Upload bertflow model",
        include_encoder: bool = False,
    ) -> str:
        """Publish this model on the Hugging Face Hub, where :meth:`load` (and ``--model-dir``) can fetch it.

        The model is saved as by :meth:`save` into a temporary folder, which ``huggingface_hub`` uploads in one
        commit (``HfApi.create_repo`` with ``exist_ok``, then ``HfApi.upload_folder``); nothing is written here.

        Args:
            repo_id: ``"user/name"`` or ``"org/name"``.
            private: visibility of a repo created now (``None``: the Hub's default); an existing repo keeps its own.
            token: a Hugging Face token (``None``: the one ``hf auth login`` stored, or ``HF_TOKEN``).
            revision: a branch to commit to, created if missing (``None``: the default branch).
            commit_message: the commit's message.
            include_encoder: bundle the encoder's files too (see :meth:`save`; mind the encoder's licence).

        Returns:
            the URL of the commit.

        Raises:
            NotFittedError: the calibrator is not fitted (checked before anything is created on the Hub).
            InputError: ``repo_id`` is not a hub repo id.
        """
        import tempfile

        from huggingface_hub import HfApi

        self._require_fitted()
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(repo_id)
            if "/" not in repo_id:
                raise HFValidationError("it has no owner")
        except HFValidationError as e:
            raise InputError(f"repo_id must read 'user/name' or 'org/name', got {repo_id!r} ({e})") from None
        source = self.source  # save() records where it wrote; a temporary folder is no origin worth keeping
        with tempfile.TemporaryDirectory(prefix="bertflow-push-") as tmp:
            folder = self.save(Path(tmp) / "model", include_encoder=include_encoder)
            self.source = source
            api = HfApi(token=token)
            api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True)
            if revision is not None:
                api.create_branch(repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
            info = api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                token=token,
                repo_type="model",
                revision=revision,
                commit_message=commit_message,
            )
        logger.info("pushed %r to %s", self, repo_id)
        return str(getattr(info, "commit_url", info))

    def model_card(self, *, include_encoder: bool = False) -> str:
        """A Markdown model card with YAML front matter (read by the Hugging Face Hub): what was fitted, on what,
        with which library version and licence, and how to load, search and publish it."""
        enc = self._pinned_encoder_config()
        encoder_license = self.encoder_license()
        info = self.fit_info
        cal = self.calibrator
        tags = ["bertflow", "sentence-embeddings", "sentence-similarity", f"calibrator-{cal.name}"]
        if cal.name == "flow":
            tags.append("bert-flow")
        # The calibrator's files are Apache-2.0 like bertflow; bundled encoder files keep the encoder's licence,
        # so a bundle is Apache-2.0 only where the encoder is too.
        if include_encoder and encoder_license != "apache-2.0":
            front = ["---", "license: other", "license_name: apache-2.0-and-encoder-license"]
        else:
            front = ["---", "license: apache-2.0"]
        front += ["library_name: bertflow", "pipeline_tag: sentence-similarity", "tags:"]
        front += [f"- {tag}" for tag in tags]
        if _is_hub_id(enc["model"]):
            # The hub links base_model to the encoder's page; a local path there would fail its validation.
            front += [f"base_model: {enc['model']}", "base_model_relation: adapter"]
        front.append("---")
        fitted = [
            ("encoder", f"`{enc['model']}`" + (f" @ `{enc['revision']}`" if enc.get("revision") else "")),
            ("encoder weights", "bundled in `encoder/`" if include_encoder else "referenced by id, not copied"),
            ("pooling", f"`{enc['pooling']}`"),
            ("max_length (tokens)", enc["max_length"]),
            ("embedding dimension in / out", f"{enc['dim']} / {cal.n_features_out_}"),
            ("encoder fingerprint", f"`{enc['fingerprint']}`"),
            *[(f"encoder file sha256 ({f})", f"`{digest}`") for f, digest in enc.get("weights_sha256", {}).items()],
            ("encoder licence", f"`{encoder_license}`" if encoder_license else "not declared in its files"),
            ("calibrator", f"`{cal!r}`"),
            ("calibrator fingerprint", f"`{calibrator_fingerprint(cal)}`"),
            ("regime (fitting corpus)", info.get("regime", "unknown")),
            ("corpus size (sentences)", info.get("n_sentences", "unknown")),
            ("corpus_sha256", f"`{info['corpus_sha256']}`" if "corpus_sha256" in info else "unknown"),
            ("labels used", "none (label-free)"),
            ("fitting time (s)", info.get("seconds", "unknown")),
            ("fitted_at (UTC)", info.get("fitted_at", "unknown")),
            ("machine", info.get("machine", "unknown")),
            ("bertflow version", __version__),
            ("format version", FORMAT_VERSION),
        ]
        lines = [
            *front,
            f"# bertflow calibrator for `{enc['model']}`",
            "",
            f"A `{cal.name}` calibrator fitted **without labels** on sentence embeddings of `{enc['model']}`, with "
            "bertflow (a reimplementation of BERT-flow, Li et al., EMNLP "
            "2020, and related post-hoc calibrations). The encoder stays frozen; similarity is the cosine of the "
            "calibrated vectors.",
            "",
            "## How it was fitted",
            "",
            "| | |",
            "|---|---|",
            *[f"| {key} | {value} |" for key, value in fitted],
            "",
            "`corpus_sha256` is the sha256 of the fitting sentences joined by newlines (each followed by `\\n`), "
            "so the corpus can be verified without being published.",
            "",
            "## Files",
            "",
            f"- `{CONFIG_FILE}`: encoder reference, calibrator type, fitting record, sha256 of every other file",
            f"- `{CALIBRATOR_DIR}/config.json`, `{CALIBRATOR_DIR}/model.safetensors`: the calibrator (no pickles)",
        ]
        if include_encoder:
            lines.append(f"- `{ENCODER_DIR}/`: the encoder's own Hugging Face files (its licence applies to them)")
        lines += [
            "",
            "## Use",
            "",
            "```python",
            "from bertflow import Embedder",
            'model = Embedder.load("PATH_OR_HUB_ID")',
            'model.similarity("A man is playing a guitar.", "Someone plays an instrument.")',
            'model.build_index(["A man is playing a guitar.", "The stock market fell."])',
            'model.search("someone making music", top_k=1)',
            "```",
            "",
            "```bash",
            'bertflow similarity "A man plays a guitar." "Someone plays an instrument." --model-dir PATH_OR_HUB_ID',
            "bertflow search build corpus.txt --model-dir PATH_OR_HUB_ID -o my-index",
            'bertflow search query my-index "someone making music" --top-k 5',
            "```",
            "",
            'Publish it with `model.push_to_hub("user/name")`, or upload this folder as it is '
            "(`huggingface_hub.HfApi().upload_folder(folder_path=PATH, repo_id=ID)`).",
            "",
            "## Licence",
            "",
            f"The calibrator and its records (`{CONFIG_FILE}`, `{CALIBRATOR_DIR}/`, this card) are released under "
            "the Apache License 2.0, like bertflow. The encoder is not covered by it: its own licence applies"
            + (f" (`{encoder_license}`, as its files declare)" if encoder_license else " (see its model card)")
            + (", also to its copy in `encoder/`." if include_encoder else "; its weights are not in this folder."),
            "",
        ]
        return "\n".join(lines)

    def close(self) -> None:
        """Stop the encoder's tokenisation worker processes, if any (see :meth:`SentenceEncoder.close`)."""
        self.encoder.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Embedder({self.encoder!r}, {self.calibrator!r})"


#: Encoder provenance saved in bertflow_config.json (SentenceEncoder.provenance); carried over by a bundled load.
_PROVENANCE_KEYS = ("commit", "weights_sha256")


def _bundles_encoder(config: dict[str, Any]) -> bool:
    """Whether a model config says its encoder's files are inside the folder (``save(include_encoder=True)``)."""
    encoder = config.get("encoder")
    return isinstance(encoder, dict) and bool(encoder.get("path"))


def _left_by_interrupted_save(folder: Path) -> bool:
    """Whether ``folder`` is missing but a save killed mid-swap left its previous version beside it (a local
    model to restore, not a hub id)."""
    prefix = f".{folder.name}{OLD_MARK}"
    try:
        return not folder.exists() and any(e.name.startswith(prefix) for e in folder.parent.iterdir())
    except OSError:
        return False


def _inside(folder: Path, rel: object, what: str) -> Path:
    """``folder / rel`` for a relative path from a saved config, refusing one that could leave the folder.

    Checked on the text, not by resolving links: a hub snapshot's files are links into the hub's blob cache, and
    what matters is that the config cannot name an absolute path or climb out with ``..``.
    """
    text = str(rel) if isinstance(rel, str) else ""
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if not text or PurePosixPath(text).is_absolute() or PureWindowsPath(text).drive or ".." in parts:
        raise ModelFileError(
            f"{folder / CONFIG_FILE}: {what} is {rel!r}, which is not a path inside the model folder; was it edited?"
        )
    return folder.joinpath(*parts)


def _verify_files(folder: Path, files: object, read_dirs: list[Path]) -> None:
    """Check the saved sha256 of every file listed in ``files`` ({relative path: hex digest}), and that every file
    the loader will read (all files under ``read_dirs``) is listed: a config stripped of its checksums, or a file
    slipped into the folder, is refused rather than loaded unchecked."""
    if not isinstance(files, dict) or not files:
        raise ModelFileError(
            f"{folder / CONFIG_FILE} has no 'files' checksums (removed or garbled), so the model cannot be checked; "
            "was it edited? Save it again with Embedder.save"
        )
    for rel, digest in files.items():
        file = _inside(folder, rel, f"files entry {rel!r}")
        if not file.is_file():
            raise ModelFileError(f"{file} is missing: the model folder is incomplete")
        if sha256_file(file) != digest:
            raise ModelFileError(f"{file} does not match its checksum: it is truncated, corrupted or edited")
    listed = {folder.joinpath(*PurePosixPath(rel).parts) for rel in files}
    for directory in read_dirs:
        if not directory.is_dir():
            raise ModelFileError(f"{directory} is missing: the model folder is incomplete")
        for file in sorted(directory.rglob("*")):
            if file.is_file() and file not in listed:
                raise ModelFileError(
                    f"{file} has no checksum in {folder / CONFIG_FILE}: it was added or the config was edited"
                )


def _is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a hub repo id (``org/name`` or ``name``) rather than a local path."""
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name)) and not Path(name).expanduser().exists()


def _snapshot(repo_id: str, revision: str | None, allow_patterns: list[str] | None = None) -> Path:
    """A hub repo's files via huggingface_hub (its cache first; the network only where allowed and needed)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=allow_patterns))
    except Exception as e:  # huggingface_hub raises many types: offline, not found, gated, invalid id, HTTP
        offline = os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")
        hint = (
            "HF_HUB_OFFLINE is set and it is not in the local cache: unset HF_HUB_OFFLINE where there is network, "
            f"or download it first (hf download {repo_id})"
            if offline
            else "check the repo id and revision, your network, and (for a private or gated repo) `hf auth login`"
        )
        raise ModelFileError(
            f"{repo_id!r} could not be fetched from the Hugging Face Hub ({type(e).__name__}: {e}); {hint}"
        ) from None


def _download(name: str, revision: str | None) -> Path:
    """Fetch a bertflow model folder from the Hugging Face Hub, or explain why ``name`` is neither folder nor repo."""
    path = Path(name).expanduser()
    if path.exists():
        raise ModelFileError(f"{path} is a file; a bertflow model is a folder (written by Embedder.save)")
    if _means_local(name):
        raise ModelFileError(f"no such folder: {name} (looked in {Path.cwd()}){_did_you_mean(path)}")
    if not _is_hub_id(name):
        raise ModelFileError(
            f"no folder {path} (looked in {Path.cwd()}), and {name!r} is not a Hugging Face Hub repo id either"
        )
    try:
        return _snapshot(name, revision)
    except ModelFileError as e:
        detail = " ".join(str(e).split())  # huggingface_hub's messages span lines; the CLI's errors take one
        raise ModelFileError(f"no such folder {name!r} here, and {detail}") from None


def _means_local(name: str) -> bool:
    """Whether ``name``, which is no existing path, can only have meant a local folder (a typo, most likely).

    A bertflow model on the Hub is always ``user/name`` (the Hub gives every new repo an owner), so a bare name,
    a path starting with ``.``, ``/`` or ``~``, one with more than two parts, or one whose first folder exists
    here (``runs/my-flwo`` next to ``runs/``) is not looked up on the network: that would answer a typo with a
    network error.
    """
    parts = name.replace("\\", "/").split("/")
    if len(parts) != 2 or name.startswith((".", "/", "~")):
        return True
    return Path(parts[0]).expanduser().is_dir()


def _did_you_mean(path: Path) -> str:
    """``"; did you mean X?"`` naming the closest existing folder next to ``path``, or ``""``."""
    import difflib

    parent = path.parent
    try:
        siblings = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.75)
    return f"; did you mean {parent / close[0]}?" if close else ""
