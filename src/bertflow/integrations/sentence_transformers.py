"""A calibrated sentence-transformers model: the :class:`Calibration` module, its encoder check, and the guarded
loader of a saved one (:func:`load_calibrated`). Building one is :mod:`.st_export`.

``modules.json`` names the module by its dotted path, ``bertflow.integrations.sentence_transformers.Calibration``
(hence this module's name, kept by saved models). Loading it needs ``trust_remote_code=True``, which would also let
a repository's own modeling code run, so :func:`load_calibrated` first refuses a folder that could run code
(:func:`check_no_code`) and checks the module list and the export's checksums.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

try:
    from sentence_transformers import SentenceTransformer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bertflow.integrations.sentence_transformers needs sentence-transformers: pip install 'bertflow[st]'"
    ) from e
try:  # sentence-transformers >= 6
    from sentence_transformers.base.modules import Module, Normalize
except ImportError:  # pragma: no cover - sentence-transformers 5 (6 keeps this path as a deprecated alias)
    from sentence_transformers.models import Module, Normalize

from ..calibrators import Calibrator
from ..encoding.loading import portable_model_name, tokenizer_fingerprint, weights_fingerprint
from ..encoding.pooling import Pooling as BertflowPooling
from ..errors import CompatibilityError, InputError, ModelFileError
from ..io.formats import read_json, verify_checksums, write_json
from ..model_folder import check_fitted_on
from ..validation import output_limit, raise_calibrated

FITTING_FILE = "fitting.json"
#: The record of the encoder the module's calibrator was fitted on (model_folder.encoder_record), beside its config.
FITTED_ON_FILE = "fitted_on.json"
#: The sha256 of every file a bertflow export's ``save`` wrote (:class:`~.st_export.CalibratedSentenceTransformer`),
#: at the top of its folder; :func:`load_calibrated` checks them.
CHECKSUM_FILE = "bertflow_checksums.json"
CHECKSUM_FORMAT = "bertflow-st-checksums"


def verify_export_checksums(folder: str | Path) -> None:
    """Check a saved export against its :data:`CHECKSUM_FILE`, where it has one (a folder saved by plain
    sentence-transformers has none and is not checked); ModelFileError naming the first missing or changed file."""
    root = Path(folder)
    config = root / CHECKSUM_FILE
    if not config.exists():
        return
    record = read_json(config)
    if record.get("format") != CHECKSUM_FORMAT:
        raise ModelFileError(f"{config} is not a bertflow checksum file; was it edited? Export the model again")
    verify_checksums(root, record.get("files"), [], config=config)


def encoder_config(model: SentenceTransformer) -> dict[str, Any]:
    """What a calibrator fitted on ``model``'s pooled embeddings depends on, in bertflow's encoder-config form. The
    fingerprints are ``None`` when the first module is not a Hugging Face transformer with a (fast) tokenizer;
    ``model`` is never an absolute local path.
    """
    first = model[0]
    hf_model = getattr(first, "auto_model", None)
    tokenizer = getattr(first, "tokenizer", None)
    fingerprint = tokenizer_fp = None
    if hf_model is not None and tokenizer is not None:
        # The same function as SentenceEncoder.fingerprint: a calibrator fitted by either library is checked by either.
        fingerprint = weights_fingerprint(hf_model, tokenizer)
        tokenizer_fp = tokenizer_fingerprint(tokenizer) if getattr(tokenizer, "is_fast", False) else None
    name = getattr(getattr(hf_model, "config", None), "_name_or_path", None) or type(first).__name__
    if Path(name).is_absolute():
        # A local folder's path would publish the user's file system and name nothing on another machine.
        name = getattr(model.model_card_data, "base_model", None) or portable_model_name(name)
    return {
        "model": name,
        "revision": None,
        "pooling": _bertflow_pooling(model),
        "max_length": model.max_seq_length,
        "dim": _pooled_dim(model),
        "fingerprint": fingerprint,
        "tokenizer_fingerprint": tokenizer_fp,
        "framework": "sentence-transformers",
    }


def _bertflow_pooling(model: SentenceTransformer) -> str | list[int] | None:
    """The pooling of ``model``'s modules in bertflow's spec (what :func:`pooling_modules` exports back), or ``None``
    where token weights are applied (``WordWeights``: their statistics cannot be named from the model)."""
    if any(type(m).__name__ == "WordWeights" for m in model):
        return None
    pooling = next((m.pooling_mode for m in model if hasattr(m, "pooling_mode")), None)
    if isinstance(pooling, (list, tuple)):
        pooling = "+".join(pooling)
    layered = next((m for m in model if type(m).__name__ == "WeightedLayerPooling"), None)
    if layered is None or pooling != "mean":
        return pooling
    weights = [float(w) for w in layered.layer_weights.detach().tolist()]
    if len({w for w in weights if w}) != 1:
        return None  # unequal layer weights: no bertflow pooling
    top = int(layered.num_hidden_layers)
    layers = [int(layered.layer_start) + i for i, w in enumerate(weights) if w]
    spec = BertflowPooling.parse(layers, top)
    named = {(1, top): "first-last-avg", (top - 1, top): "last2avg", (top,): "mean"}
    return named.get(spec.layers, spec.to_spec())


def _pooled_dim(model: SentenceTransformer) -> int | None:
    """Dimension of what reaches a Calibration module: the output of the last module before it."""
    for module in reversed([m for m in model if not isinstance(m, (Calibration, Normalize))]):
        method = getattr(module, "get_embedding_dimension", None) or getattr(
            module, "get_sentence_embedding_dimension", None
        )
        if callable(method) and method() is not None:
            return int(method())
    return None


class Calibration(Module):
    """A sentence-transformers module that maps ``features["sentence_embedding"]`` through a fitted ``calibrator``
    (fitted on this model's pooled embeddings; :func:`~.st_export.fit_calibrator` builds the pipeline).

    Place it after Pooling (and Dense, if any) and before a final ``Normalize``. The output keeps the input's device
    and dtype; the calibrator computes in float32/float64 on its own device (the flow on CUDA when available),
    whatever the model's precision. ``fitting`` (how it was fitted: ``n_sentences``, ``corpus_sha256``, ``regime``)
    is saved in ``fitting.json``; ``fitted_on`` (:func:`~bertflow.model_folder.encoder_record`) in
    ``fitted_on.json``, compared with the model it is loaded into.
    """

    config_keys: list[str] = []  # everything lives in the calibrator's own config.json

    def __init__(
        self, calibrator: Calibrator, fitting: dict[str, Any] | None = None, fitted_on: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        if not isinstance(calibrator, Calibrator):
            raise InputError(f"Calibration needs a bertflow Calibrator, got {type(calibrator).__name__}")
        calibrator.check_fitted()
        self.calibrator = calibrator
        self.fitting = dict(fitting or {})
        self.fitted_on = dict(fitted_on) if fitted_on else None

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Replace ``features["sentence_embedding"]`` [B, D] by its calibration [B, D'] (same device and dtype),
        computed in float32 on the embeddings' device."""
        x: torch.Tensor = features["sentence_embedding"]
        if x.requires_grad:
            raise CompatibilityError(
                "the Calibration module is inference-only (its calibrator is fitted by maximum likelihood on frozen "
                "embeddings, not trained with the model); train or fine-tune the model without it, then fit a "
                "calibrator with fit_calibrator"
            )
        if x.shape[-1] != self.calibrator.n_features_in_:
            raise CompatibilityError(
                f"Calibration receives {x.shape[-1]}-dimensional sentence embeddings, but its calibrator was fitted on "
                f"{self.calibrator.n_features_in_}-dimensional ones: fit it on this model with fit_calibrator"
            )
        if not torch.isfinite(x).all():
            raise InputError("the sentence embeddings given to Calibration contain NaN or Inf; the model is broken")
        transforms = self.__dict__.setdefault("_transforms", {})  # one per device, built on first use
        if x.device not in transforms:
            transforms[x.device] = self.calibrator.torch_transform(x.device)
        with torch.no_grad():
            z = transforms[x.device](x.detach().float())
            # The same bound as Embedder.encode (validation.output_limit): NaN, Inf or a corrupted weight's huge values.
            limit = output_limit(float(x.detach().abs().amax())) if x.numel() else 0.0
            bad = ~(z.abs() <= limit)
            if z.numel() and bool(bad.any()):
                raise_calibrated(z.cpu().numpy(), limit, what="the Calibration module's calibrator")
        features["sentence_embedding"] = z.to(dtype=x.dtype)
        return features

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the per-device closures ``forward`` caches, which pickle cannot send
        (sentence-transformers' multi-process encoding pickles the model to each worker)."""
        state = dict(super().__getstate__())
        state.pop("_transforms", None)
        return state

    def get_embedding_dimension(self) -> int:
        """Dimension D' of the calibrated embeddings (smaller than D for e.g. ``whitening-256``)."""
        return int(self.calibrator.n_features_out_)

    def on_model_ready(self, model: Any) -> None:
        """Refuse (:class:`CompatibilityError`) a model whose transformer, pooling or truncation differs from what the
        calibrator was fitted on, where that is recorded (the dimension is checked by :meth:`forward`)."""
        if not self.fitted_on:
            return

        def advice(key: str, recorded: Any) -> str:
            fix = f"set model.max_seq_length = {recorded}" if key == "max_length" else "refit with fit_calibrator"
            return f"{fix}, or use the model it was fitted on"

        check_fitted_on(self.calibrator, encoder_config(model), self.fitted_on, subject="this model", advice=advice)

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        """Write ``config.json`` + ``model.safetensors``, ``fitting.json`` and, when known, ``fitted_on.json``."""
        self.calibrator.save(output_path)
        write_json(Path(output_path) / FITTING_FILE, self.fitting)
        if self.fitted_on:
            write_json(Path(output_path) / FITTED_ON_FILE, self.fitted_on)

    @classmethod
    def load(cls, model_name_or_path: str, **kwargs: Any) -> Calibration:
        """Load the module folder (local, or a hub repo's subfolder) written by :meth:`save`, found with the keyword
        arguments sentence-transformers passes (``subfolder``, ``token``, ``cache_folder``, ``revision``,
        ``local_files_only``; the others are ignored); nothing is imported from the folder."""
        where = ("subfolder", "token", "cache_folder", "revision", "local_files_only")
        folder = Path(cls.load_dir_path(model_name_or_path, **{k: kwargs[k] for k in where if k in kwargs}))
        fitting, fitted_on = (
            read_json(folder / f) if (folder / f).is_file() else None for f in (FITTING_FILE, FITTED_ON_FILE)
        )
        return cls(Calibrator.load(folder), fitting=fitting, fitted_on=fitted_on)

    def __repr__(self) -> str:
        return f"Calibration({self.calibrator!r})"


CALIBRATION_TYPE = f"{__name__}.Calibration"


def _module_entries(root: Path) -> list[tuple[str, str]] | None:
    """``(path, type)`` of each module that ``root / modules.json`` lists, or ``None`` without that file."""
    try:
        entries = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{root / 'modules.json'} is not valid JSON ({e})") from None
    entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    return [(str(e.get("path", "")), str(e.get("type", ""))) for e in entries]


def check_module_list(folder: str | Path) -> None:
    """Refuse (ModelFileError) a saved sentence-transformers folder whose ``modules.json`` does not match its module
    folders: a listed module whose folder is missing (sentence-transformers would fail with a traceback), or a
    calibration module folder that it no longer lists (an uncalibrated model would load without a word).
    """
    root = Path(folder)
    entries = _module_entries(root)
    if entries is None:
        return
    for path, kind in entries:
        if path and not (root / path).is_dir():
            raise ModelFileError(
                f"modules.json in {root} lists the module {kind!r} in {path}/, which is missing: the "
                "saved model is incomplete; export it again"
            )
    listed = {path for path, _ in entries}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and (p / FITTING_FILE).is_file()):
        if sub.name not in listed:
            raise ModelFileError(
                f"{sub} holds a bertflow calibration module that modules.json in {root} does not list: loading would "
                "give the uncalibrated model; restore its entry or export the model again"
            )


def check_no_code(folder: str | Path) -> None:
    """Refuse (ModelFileError naming the first offending file) a saved sentence-transformers folder that could run
    code under ``trust_remote_code=True``: one that holds a ``*.py`` file, a JSON config (at the top or in a module
    folder) with an ``auto_map``, or a ``modules.json`` naming a class that is neither sentence-transformers' nor
    bertflow's Calibration."""
    root = Path(folder)
    code = sorted(root.rglob("*.py"))
    if code:
        raise ModelFileError(
            f"{root} contains code ({code[0].relative_to(root)}); refusing to load it with trust_remote_code=True"
        )
    for config in sorted([*root.glob("*.json"), *root.glob("*/*.json")]):
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):  # not JSON: no auto_map either; the load reports it
            continue
        if isinstance(data, dict) and "auto_map" in data:
            raise ModelFileError(
                f"{config.relative_to(root)} in {root} has an auto_map (custom modeling code); "
                "refusing to load it with trust_remote_code=True"
            )
    for _, kind in _module_entries(root) or []:
        if not (kind.startswith("sentence_transformers.") or kind == CALIBRATION_TYPE):
            raise ModelFileError(
                f"modules.json in {root} names the module class {kind!r}, which is neither "
                "sentence-transformers' nor bertflow's; refusing to import it"
            )


def load_calibrated(
    model_name_or_path: str, *, revision: str | None = None, token: bool | str | None = None, **kwargs: Any
) -> SentenceTransformer:
    """Load a saved calibrated ``SentenceTransformer`` (local folder or Hub id) with ``trust_remote_code=True``, which
    a :class:`Calibration` module needs, after fetching its files (no code runs) and refusing (ModelFileError) any
    folder that could run code, is incomplete or was altered. Keyword arguments go to ``SentenceTransformer``."""
    folder = Path(model_name_or_path).expanduser()
    if not folder.is_dir():
        from ..hub import snapshot

        folder = snapshot(model_name_or_path, revision, token=token)  # one-line errors: offline, not found ...
    check_no_code(folder)
    check_module_list(folder)
    verify_export_checksums(folder)
    kwargs.pop("trust_remote_code", None)
    return SentenceTransformer(str(folder), trust_remote_code=True, token=token, **kwargs)
