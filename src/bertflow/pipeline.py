"""Embedder: a frozen encoder joined with a fitted calibrator; fit, encode, compare, save and load.

A saved folder::

    my-model/
      bertflow_config.json      encoder (id, revision, pooling, max_length, fingerprint), calibrator type,
                                fitting record, library version, sha256 of every other file
      calibrator/config.json    calibrator parameters and fitted scalars
      calibrator/model.safetensors
      README.md                 model card: how it was fitted

The encoder's weights are referenced by id (or path) and revision, not copied. Loading re-checks everything:
checksums, format version, the encoder's fingerprint and dimension against the calibrator's.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .calibrators import Calibrator, FlowCalibrator, IdentityCalibrator
from .encoder import SentenceEncoder
from .errors import CompatibilityError, ModelFileError
from .serialization import FORMAT_VERSION, atomic_directory, read_json, sha256_file, write_json
from .validation import validate_sentences

__all__ = ["Embedder", "CONFIG_FILE", "corpus_digest"]

logger = logging.getLogger(__name__)

CONFIG_FILE = "bertflow_config.json"
CALIBRATOR_DIR = "calibrator"


def corpus_digest(sentences: Sequence[str]) -> str:
    """sha256 of the sentences joined by newlines: identifies a fitting corpus without storing it."""
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class Embedder:
    """Sentence encoder + calibrator, with SimCSE's small surface: ``fit``, ``encode``, ``similarity``.

    Args:
        encoder: the frozen encoder; ``None`` builds the embedded default (all-MiniLM-L6-v2, mean pooling).
        calibrator: an unfitted or fitted calibrator; ``None`` uses BERT-flow (:class:`FlowCalibrator`).

    Example:
        >>> emb = Embedder().fit(open("corpus.txt").read().splitlines())
        >>> emb.similarity("A man plays guitar.", "Someone plays an instrument.")
        0.71
        >>> emb.save("my-flow"); Embedder.load("my-flow").encode("hello").shape
        (384,)
    """

    def __init__(self, encoder: SentenceEncoder | None = None, calibrator: Calibrator | None = None) -> None:
        self.encoder = encoder if encoder is not None else SentenceEncoder()
        self.calibrator = calibrator if calibrator is not None else FlowCalibrator()
        self.fit_info: dict[str, Any] = {}
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
                    raise CompatibilityError(
                        f"the calibrator was fitted with {key}={fitted_on[key]!r} (encoder {fitted_on.get('model')}),"
                        f" but this encoder has {key}={ours[key]!r}; refit it or load the matching encoder"
                    )

    # -- fit / encode / similarity -----------------------------------------------------------------------

    def fit(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int = 128,
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
        self, sentences: str | Sequence[str], *, batch_size: int = 128, show_progress_bar: bool | None = None
    ) -> np.ndarray:
        """Calibrated embeddings: float32 [N, D'] (or [D'] for one string)."""
        self._require_fitted()
        raw = self.encoder.encode(sentences, batch_size=batch_size, show_progress_bar=show_progress_bar)
        return self.calibrator.transform(raw)

    def similarity(self, a: str | Sequence[str], b: str | Sequence[str]) -> float | np.ndarray:
        """Cosine similarity in the calibrated space.

        Returns:
            a float for two strings, else a float32 matrix [len(a), len(b)] (a string counts as one row).
        """
        za = np.atleast_2d(self.encode(a)).astype(np.float64)
        zb = np.atleast_2d(self.encode(b)).astype(np.float64)
        sims = _normalize(za) @ _normalize(zb).T
        if isinstance(a, str) and isinstance(b, str):
            return float(sims[0, 0])
        return sims.astype(np.float32)

    def similarity_pairwise(self, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
        """Cosine of each pair ``(a[i], b[i])``: float32 [N]."""
        if len(a) != len(b):
            raise ValueError(f"need as many first as second sentences, got {len(a)} and {len(b)}")
        za, zb = (
            _normalize(self.encode(list(a)).astype(np.float64)),
            _normalize(self.encode(list(b)).astype(np.float64)),
        )
        return (za * zb).sum(axis=1).astype(np.float32)

    def _require_fitted(self) -> None:
        if not self.calibrator.is_fitted:
            if isinstance(self.calibrator, IdentityCalibrator):
                self.calibrator.fit(np.zeros((1, self.encoder.dim)))
                return
            self.calibrator._check_fitted()

    # -- persistence -------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the folder described in the module docstring, atomically. Returns its path."""
        self._require_fitted()
        with atomic_directory(path) as tmp:
            self.calibrator.save(tmp / CALIBRATOR_DIR)
            (tmp / "README.md").write_text(self.model_card(), encoding="utf-8")
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            config = {
                "library": "bertflow",
                "bertflow_version": __version__,
                "format_version": FORMAT_VERSION,
                "encoder": self.encoder.get_config(),
                "calibrator": {"type": self.calibrator.name, "path": CALIBRATOR_DIR},
                "fitting": self.fit_info,
                "files": {p.relative_to(tmp).as_posix(): sha256_file(p) for p in files if p.name != "README.md"},
            }
            write_json(tmp / CONFIG_FILE, config)
        return Path(path)

    @classmethod
    def load(
        cls, path: str | Path, *, device: str | None = None, dtype: str = "auto", revision: str | None = None
    ) -> Embedder:
        """Load a folder written by :meth:`save`, or a Hugging Face Hub repo id holding one.

        Raises:
            ModelFileError: missing, truncated, corrupted or edited files.
            CompatibilityError: a newer format, or a calibrator that does not match the encoder.
        """
        folder = Path(path).expanduser()
        if not folder.is_dir():
            folder = _download(str(path), revision)
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
        for rel, digest in config.get("files", {}).items():
            file = folder / rel
            if not file.is_file():
                raise ModelFileError(f"{file} is missing: the model folder is incomplete")
            if sha256_file(file) != digest:
                raise ModelFileError(f"{file} does not match its checksum: it is truncated, corrupted or edited")
        try:
            calibrator = Calibrator.load(folder / config["calibrator"]["path"])
            encoder = SentenceEncoder.from_config(config["encoder"], device=device, dtype=dtype)
        except (KeyError, TypeError) as e:
            raise ModelFileError(f"{folder / CONFIG_FILE} lacks or garbles {e}; was it edited?") from None
        # The constructor compares the encoder actually loaded with what the calibrator was fitted on
        # (fingerprint, pooling, max_length, dimension), so an edited config or a swapped encoder is refused.
        embedder = cls(encoder, calibrator)
        embedder.fit_info = config.get("fitting", {})
        return embedder

    def model_card(self) -> str:
        """A Markdown model card saying what was fitted, on what, and how to use it."""
        enc = self.encoder.get_config()
        info = self.fit_info
        cal = self.calibrator
        lines = [
            "---",
            "library_name: bertflow",
            "tags: [sentence-embeddings, sentence-similarity, bert-flow]",
            f"base_model: {enc['model']}",
            "---",
            f"# bertflow calibrator for `{enc['model']}`",
            "",
            f"A `{cal.name}` calibrator ({cal!r}) fitted without labels on sentence embeddings of "
            f"`{enc['model']}` (pooling `{enc['pooling']}`, max_length {enc['max_length']}, dimension {enc['dim']}).",
            "",
            "| fitting | value |",
            "|---|---|",
        ]
        for key in ("regime", "n_sentences", "corpus_sha256", "seconds", "fitted_at", "machine"):
            if key in info:
                lines.append(f"| {key} | {info[key]} |")
        lines += [
            f"| encoder fingerprint | {enc['fingerprint']} |",
            f"| bertflow version | {__version__} |",
            "",
            "## Use",
            "",
            "```python",
            "from bertflow import Embedder",
            'model = Embedder.load("PATH_OR_HUB_ID")',
            'model.similarity("A man is playing a guitar.", "Someone plays an instrument.")',
            "```",
            "",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Embedder({self.encoder!r}, {self.calibrator!r})"


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def _download(repo_id: str, revision: str | None) -> Path:
    """Fetch a bertflow model folder from the Hugging Face Hub (needs network; cached by huggingface_hub)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision))
    except Exception as e:
        raise ModelFileError(
            f"{repo_id!r} is not a local folder and could not be fetched from the Hugging Face Hub ({e})"
        ) from None
