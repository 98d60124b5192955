"""Several fitted models scored on the same sentence pairs from one encoder and one forward pass.

``bertflow similarity --pairs PAIRS --model-dir A --model-dir B`` puts the raw encoder and each fitted model side
by side. The models must share one encoder (fingerprints, max_length, width); their poolings may differ. The pairs
are encoded once per distinct set of token statistics; each model's calibrator is applied on the CPU to its
pooling's vectors, and the raw cosines of each distinct pooling come from the same vectors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .calibrators import Calibrator
from .encoding.encoder import SentenceEncoder
from .encoding.pooling import Pooling
from .encoding.token_stats import TokenStatistics
from .errors import InputError
from .linalg import pair_cosines
from .model_folder import LATER_ENCODER_KEYS, check_fitted_on, load_encoder, load_model_folder, load_token_statistics

#: What the models of one comparison must share, read from their configs before any encoder is loaded.
SHARED_ENCODER_KEYS = ("fingerprint", "tokenizer_fingerprint", "max_length", "dim")


@dataclass(frozen=True)
class FittedModel:
    """One model folder of a comparison: its short ``name`` (the folder's, or the path as given where two folders
    share a name), its fitted calibrator, and the pooling (with its token statistics, for a weighted one) that the
    calibrator was fitted on."""

    name: str
    calibrator: Calibrator
    pooling: Pooling
    token_statistics: TokenStatistics | None = None

    @property
    def label(self) -> str:
        """How reports name it: ``"flow (stsb-flow)"``."""
        return f"{self.calibrator.name} ({self.name})"


@dataclass(frozen=True)
class PairScores:
    """Cosines of N sentence pairs: ``calibrated`` by model name and ``raw`` by label (``"raw first-last-avg"``,
    one per distinct pooling), float32 [N] each, in the order of the models."""

    calibrated: dict[str, np.ndarray]
    raw: dict[str, np.ndarray]


class ModelComparison:
    """The raw ``encoder`` (its own pooling scored raw when there is no model) and fitted ``models`` on it,
    scored together on sentence pairs (:meth:`score_pairs`); :meth:`load` checks that they fit the encoder."""

    def __init__(self, encoder: SentenceEncoder, models: Sequence[FittedModel] = ()) -> None:
        self.encoder = encoder
        self.models = list(models)
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise InputError(f"two models of a comparison have the same name: {', '.join(names)}")

    @classmethod
    def load(cls, model_dirs: Sequence[str], *, device: str | None = None, dtype: str = "auto") -> ModelComparison:
        """Read the model folders (or hub ids) ``model_dirs``, refuse them (InputError, before any encoder loads)
        unless they share one encoder, then load it once and check every calibrator against it with its own
        pooling (ModelFileError, CompatibilityError as :meth:`Embedder.load <bertflow.embedder.Embedder.load>`)."""
        if not model_dirs:
            raise InputError("give at least one model folder")
        names = _model_names(model_dirs)
        read = [load_model_folder(d, lambda folder, config, cal, source: (folder, config, cal)) for d in model_dirs]
        _check_one_encoder(model_dirs, [config["encoder"] for _, config, _ in read])
        encoder, _ = load_encoder(read[0][0], read[0][1], device=device, dtype=dtype)
        ours = encoder.get_config()
        models = []
        for name, (folder, config, calibrator) in zip(names, read, strict=True):
            pooling = Pooling.parse(config["encoder"]["pooling"], encoder.num_layers)
            stats = load_token_statistics(folder, config)
            record = {**ours, "pooling": pooling.to_spec(), "token_statistics": stats.digest() if stats else None}
            check_fitted_on(calibrator, record, config["calibrator"].get("fitted_on"), subject=f"{name}'s encoder")
            models.append(FittedModel(name, calibrator, pooling, stats))
        return cls(encoder, models)

    def score_pairs(self, a: Sequence[str], b: Sequence[str], *, show_progress_bar: bool | None = None) -> PairScores:
        """Cosines of the pairs ``(a[i], b[i])`` for every model and every distinct raw pooling.

        Each sentence is encoded once per group of poolings sharing token statistics (once in all unless models
        weight tokens with different statistics). ``show_progress_bar``: ``None`` shows it for 4,096 sentences
        or more.
        """
        if len(a) != len(b):
            raise InputError(f"need as many first as second sentences, got {len(a)} and {len(b)}")
        n = len(a)
        sentences = [*a, *b]
        passes = self._passes()
        vectors: dict[tuple[str, str | None], np.ndarray] = {}
        from tqdm.auto import tqdm

        show = len(sentences) >= 4096 if show_progress_bar is None else show_progress_bar
        own = self.encoder.token_statistics
        with tqdm(total=len(sentences) * len(passes), desc="similarity", unit="sent", disable=not show) as bar:
            try:
                for stats, poolings in passes:
                    if stats is not None:
                        self.encoder.token_statistics = stats  # the weights of this pass's weighted poolings
                    out = self.encoder.encode(
                        sentences, poolings=poolings, show_progress_bar=False, progress=bar.update
                    )
                    vectors.update({_key(p, stats): out[p.key] for p in poolings})
            finally:
                if self.encoder.token_statistics is not own:
                    self.encoder.token_statistics = own
        raw = {label: pair_cosines(vectors[key][:n], vectors[key][n:]) for label, key in self._raw_labels().items()}
        calibrated = {}
        for m in self.models:
            z = m.calibrator.transform(vectors[_key(m.pooling, m.token_statistics)])
            calibrated[m.name] = pair_cosines(z[:n], z[n:])
        return PairScores(calibrated, raw)

    def _raw(self) -> list[tuple[Pooling, TokenStatistics | None, str | None]]:
        """The distinct (pooling, statistics) to encode, first-seen order, with the model that brought each."""
        if not self.models:
            own = self.encoder.pooling
            return [(own, self.encoder.token_statistics if own.weighting.weighted else None, None)]
        seen: dict[tuple[str, str | None], tuple[Pooling, TokenStatistics | None, str | None]] = {}
        for m in self.models:
            seen.setdefault(_key(m.pooling, m.token_statistics), (m.pooling, m.token_statistics, m.name))
        return list(seen.values())

    def _raw_labels(self) -> dict[str, tuple[str, str | None]]:
        """``{"raw <pooling>": vector key}``; a pooling weighted with two models' statistics names the model."""
        raw = self._raw()
        counts = Counter(pooling.name for pooling, _, _ in raw)
        return {
            f"raw {p.name}" + (f" ({name})" if counts[p.name] > 1 else ""): _key(p, stats) for p, stats, name in raw
        }

    def _passes(self) -> list[tuple[TokenStatistics | None, list[Pooling]]]:
        """Forward passes: one per distinct token statistics (unweighted poolings ride along with the first)."""
        groups: dict[str | None, tuple[TokenStatistics | None, list[Pooling]]] = {}
        for pooling, stats, _ in self._raw():
            digest = stats.digest() if stats is not None else None
            groups.setdefault(digest, (stats, []))[1].append(pooling)
        if None in groups and len(groups) > 1:
            groups[next(k for k in groups if k is not None)][1].extend(groups.pop(None)[1])
        return list(groups.values())


def _key(pooling: Pooling, stats: TokenStatistics | None) -> tuple[str, str | None]:
    """What identifies a pooling's vectors: its key, and the digest of the statistics a weighted one uses."""
    return pooling.key, (stats.digest() if stats is not None and pooling.weighting.weighted else None)


def _model_names(model_dirs: Sequence[str]) -> list[str]:
    """Short names of the model folders: each folder's (or hub repo's) last path part, or the path as given
    where two share one; refused: a folder given twice, a name that cannot be a TSV column name."""
    resolved = [str(Path(d).expanduser().resolve()) if Path(d).expanduser().exists() else d for d in model_dirs]
    for i, r in enumerate(resolved):
        if r in resolved[:i]:
            raise InputError(f"--model-dir {model_dirs[i]} is given twice")
    short = [Path(d.rstrip("/")).name or d for d in model_dirs]
    names = short if len(set(short)) == len(short) else [str(d) for d in model_dirs]
    for name in names:
        if any(c in name for c in "\t\r\n"):
            raise InputError(f"model folder name {name!r} holds a tab or line break: it cannot name a TSV column")
    return names


def _check_one_encoder(model_dirs: Sequence[str], encoders: Sequence[dict[str, Any]]) -> None:
    """Refuse model configs whose encoders differ in anything but the pooling (one line naming both)."""
    first = encoders[0]
    for path, enc in zip(model_dirs[1:], encoders[1:], strict=True):
        for key in SHARED_ENCODER_KEYS:
            ours, theirs = first.get(key), enc.get(key)
            if key in LATER_ENCODER_KEYS and (ours is None or theirs is None):
                continue  # saved before bertflow recorded it: nothing to compare
            if ours != theirs:
                raise InputError(
                    f"--model-dir {path} was fitted on another encoder than {model_dirs[0]} ({key} {theirs!r} vs "
                    f"{ours!r}, encoders {enc.get('model')} and {first.get('model')}): models compared in one run "
                    "must share the encoder and max_length (poolings may differ); score them in separate runs"
                )
