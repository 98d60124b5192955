"""The saved-model folder of an :class:`~bertflow.embedder.Embedder`: writing it, reading it back, verifying it.

The layout is in README.md: ``bertflow_config.json`` (encoder, calibrator, fitting record, sha256 of every other
file), ``calibrator/``, ``token_statistics/`` (a weighted pooling's), ``README.md`` (the model card) and, with
``include_encoder``, ``encoder/``. No absolute local paths: a local encoder is named by its folder's name and
``encoder.local_path``, its path relative to the model folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ._version import __version__
from .calibrators import Calibrator
from .encoding.encoder import SentenceEncoder
from .encoding.loading import local_encoder_dir, portable_model_name, resolve_model
from .encoding.token_stats import TokenStatistics
from .errors import CompatibilityError, InputError, ModelFileError
from .hub import download_model, snapshot
from .io.files import FOLDER_KINDS, atomic_directory, check_output_folder, folder_present, read_folder
from .io.formats import FORMAT_VERSION, check_format, path_inside, read_json, sha256_file, verify_checksums, write_json

if TYPE_CHECKING:
    from .embedder import Embedder

T = TypeVar("T")

logger = logging.getLogger(__name__)

CONFIG_FILE = FOLDER_KINDS["model"][0]  # "bertflow_config.json"
CALIBRATOR_DIR = "calibrator"
TOKEN_STATS_DIR = "token_statistics"
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
#: The PyTorch-pickle weight files copied instead when a checkpoint has no safetensors file.
TORCH_BIN_PATTERNS = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")

#: Encoder provenance saved in bertflow_config.json (SentenceEncoder.provenance); carried over by a bundled load.
PROVENANCE_KEYS = ("commit", "weights_sha256", "packaged_as")
#: Keys of every fitting record (:func:`fit_record`), whichever route fitted the model.
FIT_RECORD_KEYS = ("n_sentences", "corpus_sha256", "corpus_file_sha256", "regime", "seconds", "fitted_at", "machine")
#: What a ``fitted_on`` record keeps of the encoder whose embeddings a calibrator was fitted on (plus ``framework``:
#: ``"bertflow"`` for a :class:`~bertflow.encoding.encoder.SentenceEncoder`, ``"sentence-transformers"`` for a model
#: of that library).
ENCODER_KEYS = ("model", "revision", "pooling", "max_length", "dim", "fingerprint", "tokenizer_fingerprint")
#: Keys that records written by an earlier bertflow lack: such a record is not compared on them.
LATER_ENCODER_KEYS = ("tokenizer_fingerprint",)
#: The fields compared with a calibrator's ``fitted_on`` before it is applied (the dimension is checked apart);
#: each only where both sides record it.
_CHECKED_KEYS = ("fingerprint", "pooling", "max_length", "token_statistics", "tokenizer_fingerprint")
#: What a mismatch of a key means, where its name does not say it.
_MISMATCH_NOTES = {
    "tokenizer_fingerprint": " (the tokenizer gives other token ids than at the fit: its tokenizer.json or "
    "tokenizer_config.json changed, e.g. lowercasing, special tokens or truncation side)"
}


def encoder_record(encoder: Any, *, framework: str = "bertflow") -> dict[str, Any]:
    """The ``fitted_on`` record of ``encoder`` (a :class:`~bertflow.encoding.encoder.SentenceEncoder` or a mapping
    with :data:`ENCODER_KEYS`): those keys plus ``framework``, the same whichever route fitted the calibrator."""
    config = encoder if isinstance(encoder, Mapping) else encoder.get_config()
    if missing := [key for key in ENCODER_KEYS if key not in config]:
        raise ValueError(f"an encoder record needs {', '.join(missing)}")
    # A weighted pooling's vectors also depend on the token statistics its weights come from (their digest).
    extra = {"token_statistics": config["token_statistics"]} if config.get("token_statistics") else {}
    record = {**{key: config[key] for key in ENCODER_KEYS}, **extra, "framework": framework}
    # The record is saved and published with the calibrator: a local folder's name, never its absolute path.
    record["model"] = portable_model_name(str(record["model"]))
    return record


def check_fitted_on(
    calibrator: Calibrator,
    ours: Mapping[str, Any],
    fitted_on: Mapping[str, Any] | None = None,
    *,
    subject: str = "this encoder",
    advice: Callable[[str, Any], str] | None = None,
) -> None:
    """Refuse (:class:`CompatibilityError`) to apply ``calibrator`` to embeddings of another encoder than the one
    it was fitted on: ``ours`` (the encoder at hand's config; a ``None`` value is not compared) against
    ``fitted_on`` (its :func:`encoder_record`; ``None``: the dimension only). ``subject`` names the encoder at hand
    in messages; ``advice(key, recorded)`` says what to do (default: refit, or load the matching encoder)."""
    check_dimension(calibrator, ours.get("dim"), ours.get("model"))
    if not fitted_on:
        if calibrator.name != "identity":  # nothing fitted that another encoder could make wrong
            # Fitted with plain .fit(X): only the dimension can be checked. Python shows this once per place.
            warnings.warn(
                f"the {calibrator.name} calibrator records no encoder (fitted with plain .fit(X)), so only its "
                f"dimension can be checked against {subject}; make sure X came from this encoder, pooling and "
                "max_length, or fit through Embedder.fit / fit_embeddings, which record it",
                UserWarning,
                stacklevel=3,
            )
        return
    for key in _CHECKED_KEYS:
        if key in fitted_on and ours.get(key) is not None and fitted_on[key] != ours[key]:
            todo = advice(key, fitted_on[key]) if advice else "refit it or load the matching encoder"
            raise CompatibilityError(
                f"the calibrator was fitted with {key}={fitted_on[key]!r} (encoder {fitted_on.get('model')}), but "
                f"{subject} has {key}={ours[key]!r}; {todo}{_MISMATCH_NOTES.get(key, '')}"
            )


def check_dimension(calibrator: Calibrator, dim: int | None, model: object = None) -> None:
    """Refuse (:class:`CompatibilityError`) a ``calibrator`` whose input width is not ``dim`` (``None``: unknown),
    the width of the encoder ``model``'s embeddings."""
    if dim is not None and int(calibrator.n_features_in_) != int(dim):
        raise CompatibilityError(
            f"the calibrator was fitted on {calibrator.n_features_in_}-dimensional embeddings, but "
            f"{model} gives {dim}; refit it for this encoder"
        )


def corpus_digest(sentences: Sequence[str]) -> str:
    """sha256 of the sentences joined by newlines: identifies a fitting corpus without storing it."""
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8") + b"\n")
    return h.hexdigest()


def fit_record(
    n_sentences: int,
    *,
    regime: str,
    seconds: float,
    device: object,
    corpus_sha256: str | None = None,
    corpus_file_sha256: str | None = None,
    ranks: int | None = None,
) -> dict[str, Any]:
    """How a model was fitted, as saved with it: exactly the keys :data:`FIT_RECORD_KEYS` (``None`` where unknown).
    ``seconds``: wall time of encoding and fitting; ``corpus_sha256``: :func:`corpus_digest` of the sentences;
    ``corpus_file_sha256``: the file's (a distributed fit of ``ranks`` processes never holds them all)."""
    machine = f"{platform.machine()} {platform.system()}, device {device}"
    return {
        "n_sentences": int(n_sentences),
        "corpus_sha256": corpus_sha256,
        "corpus_file_sha256": corpus_file_sha256,
        "regime": regime,
        "seconds": round(float(seconds), 2),
        "fitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine if ranks is None else f"{ranks} rank(s), {machine}",
    }


def save_model_folder(
    path: str | Path, embedder: Embedder, card: Callable[..., str], *, include_encoder: bool, overwrite: bool
) -> None:
    """Write the model folder of the fitted ``embedder`` at ``path``, atomically (a crash leaves an old one), with
    its :meth:`~bertflow.embedder.Embedder.fit_records`. ``card`` (:func:`~bertflow.card.model_card`) makes README.md
    once the output is checked; ``include_encoder`` copies the encoder's HF files (from ``embedder.encoder_dir`` when
    it was loaded from a bundled copy). OutputError where ``path`` may not be written."""
    encoder, calibrator = embedder.encoder, embedder.calibrator
    fit_info, fitted_on = embedder.fit_records()
    weighted = encoder.pooling.weighting.weighted
    if weighted and encoder.token_statistics is None:
        raise InputError(
            f"pooling {encoder.pooling.name!r} weights tokens, and the encoder has no token statistics to save "
            "with it: fit the model (Embedder.fit) first"
        )
    check_output_folder(path, "model", overwrite=overwrite)
    with atomic_directory(path) as tmp:
        calibrator.save(tmp / CALIBRATOR_DIR)
        if weighted:
            encoder.token_statistics.save(tmp / TOKEN_STATS_DIR)
        encoder_config = pinned_encoder_config(encoder, folder=None if include_encoder else Path(path))
        if include_encoder:
            copied = copy_encoder_files(encoder, tmp / ENCODER_DIR, source=embedder.encoder_dir)
            encoder_config["path"] = ENCODER_DIR
            logger.info("copied %d encoder file(s) into %s", copied, Path(path) / ENCODER_DIR)
        (tmp / "README.md").write_text(card(embedder, include_encoder=include_encoder), encoding="utf-8")
        # The model card is for people and may be edited on the hub; it carries no numbers we use: not checksummed.
        files = {p.relative_to(tmp).as_posix(): p for p in sorted(tmp.rglob("*")) if p.is_file()}
        config = {
            "library": "bertflow",
            "bertflow_version": __version__,
            "format_version": FORMAT_VERSION,
            "encoder": encoder_config,
            "calibrator": {"type": calibrator.name, "path": CALIBRATOR_DIR, "fitted_on": fitted_on},
            **({"token_statistics": {"path": TOKEN_STATS_DIR}} if weighted else {}),
            "fitting": fit_info,
            "files": {rel: sha256_file(p) for rel, p in files.items() if rel != "README.md"},
        }
        write_json(tmp / CONFIG_FILE, config)


def pinned_encoder_config(encoder: SentenceEncoder, *, folder: Path | None = None) -> dict[str, Any]:
    """The encoder's config as saved: with its provenance, ``revision`` pinned to the hub commit it was loaded from
    (the one asked for kept as ``requested_revision``), ``model`` a portable name, and with ``folder`` (the model
    folder) a local encoder's ``local_path`` relative to it."""
    config = encoder.get_config()
    provenance = encoder.provenance()
    commit = provenance.get("commit")
    if commit and config.get("revision") != commit:
        if config.get("revision"):
            config["requested_revision"] = config["revision"]
        config["revision"] = commit
    config["model"] = portable_model_name(str(config["model"]))
    local = local_encoder_dir(encoder)
    if folder is not None and local is not None:
        # Relative, not absolute: the folder may be published as is (module docstring).
        config["local_path"] = Path(os.path.relpath(local, Path(folder).expanduser().resolve())).as_posix()
    return {**config, **provenance}


def copy_encoder_files(encoder: SentenceEncoder, dest: Path, *, source: Path | None = None) -> int:
    """Copy the encoder's HF checkpoint files (see :data:`ENCODER_FILE_PATTERNS`) into the new folder ``dest``;
    returns how many. ``source``: the folder holding them (default: where the encoder was loaded from, or the
    hub snapshot of the commit it was loaded from)."""
    if source is None:
        _, load_path = resolve_model(encoder.model_id)
        source = Path(load_path)
        if not source.is_dir():
            # The commit the encoder was loaded from, not a branch that may have moved since.
            revision = encoder.provenance().get("commit") or encoder.revision
            source = snapshot(load_path, revision, allow_patterns=[*ENCODER_FILE_PATTERNS])
    files = {p for pattern in ENCODER_FILE_PATTERNS for p in source.glob(pattern) if p.is_file()}
    if not any(p.suffix == ".safetensors" for p in files):
        files |= {p for pattern in TORCH_BIN_PATTERNS for p in source.glob(pattern) if p.is_file()}
    if not any(p.name == "config.json" for p in files):
        raise ModelFileError(
            f"cannot copy the encoder: {source} has no config.json, so it is not a Hugging Face checkpoint; "
            "save without include_encoder"
        )
    dest.mkdir(parents=True)
    for file in sorted(files):
        shutil.copyfile(file, dest / file.name)  # a new file: the umask's mode, not the source's
    return len(files)


def load_model_folder(
    path: str | Path, assemble: Callable[[Path, dict[str, Any], Calibrator, str], T], *, revision: str | None = None
) -> T:
    """What ``assemble(folder, config, calibrator, source)`` makes of the model folder at ``path`` (or hub repo
    ``path`` at ``revision``; ``source``: the resolved folder or the hub id), a local one read inside
    :func:`~bertflow.io.files.read_folder` (never two saves mixed). ModelFileError: missing, corrupted or edited
    files, a newer format, or a path that is neither a folder nor a hub repo that can be fetched."""
    folder = Path(path).expanduser()
    if not folder_present(folder):
        folder = download_model(str(path), revision)
        return assemble(folder, *read_model_folder(folder), str(path))
    source = str(folder.resolve())

    def read(f: Path) -> tuple[dict[str, Any], Calibrator, T | None]:
        config, calibrator = read_model_folder(f)
        # A bundled encoder's weights are files of the folder too: assembled within the same read.
        return config, calibrator, assemble(f, config, calibrator, source) if bundles_encoder(config) else None

    config, calibrator, made = read_folder(folder, read)
    return made if made is not None else assemble(folder, config, calibrator, source)


def read_model_folder(folder: Path) -> tuple[dict[str, Any], Calibrator]:
    """The config (format and checksums verified) and the calibrator of the model folder ``folder``."""
    config = read_json(folder / CONFIG_FILE)
    if config.get("library") != "bertflow":
        raise ModelFileError(f"{folder / CONFIG_FILE} is not a bertflow model config")
    check_format(config, folder / CONFIG_FILE, kind="model")
    try:  # the folders the checksums must cover: calibrator, bundled encoder, token statistics
        dirs = [_inside(folder, config["calibrator"]["path"], "calibrator.path")]
        if config["encoder"].get("path"):
            dirs.append(_inside(folder, config["encoder"]["path"], "encoder.path"))
        if (stats_dir := _token_stats_dir(folder, config)) is not None:
            dirs.append(stats_dir)
    except (KeyError, TypeError, AttributeError) as e:
        raise ModelFileError(f"{folder / CONFIG_FILE} lacks or garbles {e}; was it edited?") from None
    verify_checksums(folder, config.get("files"), dirs, config=folder / CONFIG_FILE)
    return config, Calibrator.load(dirs[0])


def load_encoder(
    folder: Path, config: dict[str, Any], *, device: str | None, dtype: str
) -> tuple[SentenceEncoder, Path | None]:
    """The encoder the config of ``folder`` names, and the folder of its bundled copy (loaded with the original id,
    revision and provenance), or ``None``."""
    encoder_dir: Path | None = None
    try:
        enc = config["encoder"]
        stats = load_token_statistics(folder, config)
        kwargs = {} if stats is None else {"token_statistics": stats}
        if bundles_encoder(config):
            # A self-contained folder: load the copy, but keep the original id and revision as provenance.
            encoder_dir = _inside(folder, enc["path"], "encoder.path")
            if not (encoder_dir / "config.json").is_file():
                raise ModelFileError(f"{encoder_dir} has no config.json: the bundled encoder is incomplete")
            encoder = SentenceEncoder.from_config(
                {**enc, "model": str(encoder_dir)}, device=device, dtype=dtype, **kwargs
            )
            encoder.model_id, encoder.revision = enc["model"], enc.get("revision")
            encoder.pin_provenance({k: enc[k] for k in PROVENANCE_KEYS if k in enc})
        else:
            encoder = SentenceEncoder.from_config(_locate_local(folder, enc), device=device, dtype=dtype, **kwargs)
    except (KeyError, TypeError, AttributeError) as e:
        raise ModelFileError(f"{folder / CONFIG_FILE} lacks or garbles {e}; was it edited?") from None
    return encoder, encoder_dir


def load_token_statistics(folder: Path, config: dict[str, Any]) -> TokenStatistics | None:
    """The token statistics saved in ``folder`` (``None`` for an unweighted pooling; ModelFileError if missing)."""
    stats_dir = _token_stats_dir(folder, config)
    if stats_dir is not None:
        return TokenStatistics.load(stats_dir)
    if config["encoder"].get("token_statistics"):
        raise ModelFileError(f"{folder} lacks the token statistics its weighted pooling needs; was it edited?")
    return None


def _locate_local(folder: Path, enc: dict[str, Any]) -> dict[str, Any]:
    """``enc`` with ``model`` set to the folder its ``local_path`` names (relative to ``folder``); InputError if
    neither that nor a folder of its name here exists."""
    rel = enc.get("local_path")
    if not rel:
        return enc  # a hub id, or a folder saved before local_path existed (its path as given)
    found = (folder / str(rel)).resolve()
    if found.is_dir():
        return {**enc, "model": str(found)}
    if Path(str(enc["model"])).expanduser().is_dir():
        return enc
    raise InputError(
        f"cannot find the encoder of {folder}: it was fitted on the local folder {enc['model']!r}, recorded at "
        f"{rel!r} relative to the model folder ({found}), which does not exist; put the encoder folder there, or "
        "save the model with include_encoder=True to keep a copy inside it"
    )


def _token_stats_dir(folder: Path, config: dict[str, Any]) -> Path | None:
    """The model folder's token statistics folder (a weighted pooling's), or ``None``."""
    entry = config.get("token_statistics")
    return None if entry is None else _inside(folder, entry["path"], "token_statistics.path")


def bundles_encoder(config: dict[str, Any]) -> bool:
    """Whether a model config says its encoder's files are inside the folder (``save(include_encoder=True)``)."""
    encoder = config.get("encoder")
    return isinstance(encoder, dict) and bool(encoder.get("path"))


def _inside(folder: Path, rel: object, what: str) -> Path:
    """``folder / rel`` for a relative path from the model's config (see :func:`~bertflow.io.formats.path_inside`)."""
    return path_inside(folder, rel, config=folder / CONFIG_FILE, what=what)
