"""A fitted bertflow calibrator as a sentence-transformers module.

:func:`fit_calibrator` embeds a corpus with a ``SentenceTransformer``, fits a calibrator on it (no labels) and
returns a new ``SentenceTransformer`` whose pipeline ends in the calibration (a ``Dense`` or a :class:`Calibration`
module, then ``Normalize``), so ``model.encode`` returns calibrated embeddings::

    from sentence_transformers import SentenceTransformer
    from bertflow.integrations.sentence_transformers import fit_calibrator, load_calibrated

    base = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    model = fit_calibrator(base, my_sentences, calibrator="whitening-256")  # Transformer, Pooling, Dense, Normalize
    model.save("minilm-whitening")
    model = SentenceTransformer("minilm-whitening")             # plain sentence-transformers, bertflow not needed
    model = fit_calibrator(base, my_sentences, calibrator="flow")   # Transformer, Pooling, Calibration, Normalize
    model.save("minilm-flow")
    model = load_calibrated("minilm-flow")                      # refuses a folder with code, then loads

**Where the module goes.** A calibrator is fitted on, and must be applied to, the *unnormalised* pooled vectors:
BERT-flow's density and whitening's covariance are those of the raw embeddings, and L2-normalising first would
discard the norm and bend the distribution the calibrator was fitted on. So the calibration goes after Pooling (and
any Dense layers) and *before* a trailing ``Normalize``. ``fit_calibrator`` keeps that ``Normalize`` (re-normalising
the calibrated vectors) by default when the model had one: cosine similarity is unchanged by it, and dot product
then equals cosine, as users of a normalised model expect. ``normalize=False`` drops it (e.g. to read the flow's
Gaussian latents); ``normalize=True`` adds one.

**Affine calibrators** (whitening, whitening-k, standard-norm, all-but-the-top, identity, chains of them) are
exported as sentence-transformers' own ``Dense`` with identity activation (:func:`as_dense`): the saved model loads
with plain ``SentenceTransformer(path)`` and needs neither bertflow nor ``trust_remote_code``.

**Anchored whitening and auto** exported from an Embedder (:func:`from_embedder`) after a token-averaging pooling
become a chain of sentence-transformers' own modules (:mod:`.st_anchored`), which also loads without bertflow.

**The others** (the flow; anchored and auto after cls pooling or in :func:`fit_calibrator`) become a
:class:`Calibration` module. ``model.save(path)`` writes its folder
``{idx}_Calibration/`` with the calibrator's ``config.json`` + ``model.safetensors``
(:meth:`bertflow.calibrators.Calibrator.save`; never a pickle) and ``fitting.json`` (corpus size and sha256,
regime). ``modules.json`` names this class by its dotted path, ``bertflow.integrations.sentence_transformers.
Calibration``. Loading it needs ``trust_remote_code=True``: sentence-transformers >= 6 imports no module class
outside its own namespace without it, even from an installed package, and offers no allow-list. With the flag it
imports the installed bertflow (no code is read from the model folder: the class path has more than one dot, which
transformers' dynamic-module loader rejects, so sentence-transformers falls back to a normal import). But the flag
also lets a repository's own modeling code run, so :func:`load_calibrated` first refuses a folder holding code, an
``auto_map`` or a foreign module class (:func:`check_no_code`).

**Checks.** The calibrator records what it was fitted on (the transformer's weight fingerprint, the pooling mode,
``max_seq_length``, dimension). When a model is built or loaded, :meth:`Calibration.on_model_ready` refuses
another transformer, pooling or truncation with a :class:`~bertflow.errors.CompatibilityError`; ``forward``
refuses embeddings of another dimension. The calibrator runs as a float32 torch function on the embeddings' device
(:meth:`~bertflow.calibrators.Calibrator.torch_transform`). Calibration is inference-only (no gradients flow
through it); fine-tune the model first, then calibrate.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    from sentence_transformers import SentenceTransformer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bertflow.integrations.sentence_transformers needs sentence-transformers: pip install 'bertflow[st]'"
    ) from e
try:  # sentence-transformers >= 6
    from sentence_transformers.base.modules import Dense, Module, Normalize
except ImportError:  # pragma: no cover - sentence-transformers 5 (6 keeps this path as a deprecated alias)
    from sentence_transformers.models import Dense, Module, Normalize

try:
    from sentence_transformers.sentence_transformer.model_card import SentenceTransformerModelCardData
except ImportError:  # pragma: no cover - sentence-transformers 5
    from sentence_transformers.model_card import SentenceTransformerModelCardData

from ..calibrators import Calibrator, parse_calibrator
from ..card import encoder_license, encoder_reference, on_hub
from ..embedder import Embedder
from ..encoding.encoder import SentenceEncoder
from ..encoding.loading import portable_model_name, tokenizer_fingerprint, weights_fingerprint
from ..encoding.pooling import Pooling as BertflowPooling
from ..encoding.pooling.layers import LayerMeanPooling
from ..errors import CompatibilityError, InputError, ModelFileError
from ..io.formats import read_json, sha256_file, verify_checksums, write_json
from ..model_folder import check_fitted_on, corpus_digest, encoder_record, fit_record, pinned_encoder_config
from ..portability import calibrator_needs_bertflow
from ..validation import output_limit, raise_calibrated, validate_sentences
from .st_anchored import anchored_modules

__all__ = [
    "CHECKSUM_FILE",
    "Calibration",
    "CalibratedSentenceTransformer",
    "affine_map",
    "as_dense",
    "check_module_list",
    "verify_export_checksums",
    "encoder_config",
    "fit_calibrator",
    "from_embedder",
    "load_calibrated",
    "pooling_modules",
]

logger = logging.getLogger(__name__)

FITTING_FILE = "fitting.json"
#: The record of the encoder the module's calibrator was fitted on (identity.encoder_record), beside its config.
FITTED_ON_FILE = "fitted_on.json"
#: The sha256 of every file a bertflow export's ``save`` wrote (:class:`CalibratedSentenceTransformer`), at the top of
#: its folder; :func:`load_calibrated` checks them.
CHECKSUM_FILE = "bertflow_checksums.json"
_CHECKSUM_FORMAT = "bertflow-st-checksums"


def _file_stats(folder: Path) -> dict[Path, tuple[int, int, int]]:
    """(size, mtime_ns, inode) of every file under ``folder`` (empty if it does not exist)."""
    if not folder.is_dir():
        return {}
    return {
        f: (st.st_size, st.st_mtime_ns, st.st_ino)
        for f in folder.rglob("*")
        if f.is_file() and f.name != CHECKSUM_FILE
        for st in [f.stat()]
    }


class CalibratedSentenceTransformer(SentenceTransformer):
    """The ``SentenceTransformer`` that :func:`from_embedder` and :func:`fit_calibrator` return: a plain one, whose
    ``save`` (and so ``save_pretrained`` / ``push_to_hub``) also writes :data:`CHECKSUM_FILE`, the sha256 of every
    file that save wrote, so that :func:`load_calibrated` refuses a folder whose weights were edited afterwards (a
    ``Dense`` weight scaled by 1e30 would otherwise give 1e29-sized vectors without a word). The saved folder still
    loads with plain ``SentenceTransformer(path)``, which ignores the file."""

    def save(self, path: str, *args: Any, **kwargs: Any) -> None:
        folder = Path(path)
        before = _file_stats(folder)
        super().save(path, *args, **kwargs)
        written = {f: stat for f, stat in _file_stats(folder).items() if before.get(f) != stat}
        files = {f.relative_to(folder).as_posix(): sha256_file(f) for f in sorted(written)}
        write_json(folder / CHECKSUM_FILE, {"format": _CHECKSUM_FORMAT, "files": files})


def verify_export_checksums(folder: str | Path) -> None:
    """Check a saved export against its :data:`CHECKSUM_FILE`, where it has one (a folder saved by plain
    sentence-transformers has none and is not checked).

    Raises:
        ModelFileError: one line naming the first file that is missing or does not match its checksum.
    """
    root = Path(folder)
    config = root / CHECKSUM_FILE
    if not config.exists():
        return
    record = read_json(config)
    if record.get("format") != _CHECKSUM_FORMAT:
        raise ModelFileError(f"{config} is not a bertflow checksum file; was it edited? Export the model again")
    verify_checksums(root, record.get("files"), [], config=config)


def affine_map(calibrator: Calibrator) -> tuple[np.ndarray, np.ndarray] | None:
    """The fitted ``calibrator`` as one affine map ``x -> x @ W + b`` (float64), or ``None`` if it is not affine.

    Affine: identity, standard-norm, all-but-the-top, whitening (any ``n_components``) and chains of these (the
    fitted steps, ``steps_``, composed into one matrix). The flow is non-linear; the anchored and auto calibrators
    normalise two blocks separately, which no single affine map does.

    Returns:
        ``(W [D, D'], b [D'])`` with ``b = -mean @ W`` (the mean folded into the bias), or ``None``.
    """
    calibrator.check_fitted()
    if not calibrator.is_affine():
        return None
    # Each step's map is affine and computes in float64 (transform64), so probing it at 0 and at the unit vectors reads
    # off b and W exactly (to float64 rounding), the same way for every class and for the composition.
    d = calibrator.n_features_in_
    probes = np.vstack([np.zeros((1, d)), np.eye(d)])
    out = calibrator.transform64(probes)
    return out[1:] - out[0], out[0]


def as_dense(calibrator: Calibrator) -> Dense:
    """A sentence-transformers ``Dense`` module (identity activation) computing the affine ``calibrator``.

    It saves as ``config.json`` + ``model.safetensors`` in sentence-transformers' own format and reloads with
    plain ``SentenceTransformer(path)``: no ``trust_remote_code``, no bertflow. Its output agrees with
    ``calibrator.transform`` to float32 rounding.

    Raises:
        InputError: the calibrator is not affine (flow, anchored, auto): see :func:`affine_map`.
    """
    mapping = affine_map(calibrator)
    if mapping is None:
        raise InputError(
            f"{type(calibrator).__name__} is not an affine map, so it has no Dense equivalent; use the Calibration "
            "module (loading then needs bertflow and trust_remote_code=True)"
        )
    W, b = mapping
    return Dense(
        W.shape[0],
        W.shape[1],
        bias=True,
        activation_function=torch.nn.Identity(),
        init_weight=torch.from_numpy(np.ascontiguousarray(W.T, dtype=np.float32)),  # nn.Linear stores [out, in]
        init_bias=torch.from_numpy(b.astype(np.float32)),
    )


@dataclass
class BertflowModelCardData(SentenceTransformerModelCardData):
    """Model card data of a model that ends in a bertflow calibration.

    After sentence-transformers' usage snippet the card gets a "bertflow calibration" section: the fit record
    (``facts``: encoder, pooling, calibrator, corpus size and sha256, licences) and whether the folder loads
    without bertflow, and if not why (:func:`bertflow.portability.calibrator_needs_bertflow`). With a
    :class:`Calibration` module (``needs_bertflow`` set) the snippet also installs bertflow and loads with
    ``trust_remote_code=True``, which sentence-transformers' own snippet says neither of.
    """

    facts: list[tuple[str, str]] = field(default_factory=list)
    needs_bertflow: str | None = None

    def generate_usage_snippet(self) -> str:
        snippet = super().generate_usage_snippet()
        if self.needs_bertflow:
            # The load line is 'model = SentenceTransformer("<id>")' in sentence-transformers 5 and 6.
            load = re.compile(r'^(model = SentenceTransformer\("[^"]*")\)$', re.MULTILINE)
            note = "  # imports the installed bertflow; no code from the repository"
            snippet = load.sub(r"\1, trust_remote_code=True)" + note, snippet)
            snippet = snippet.replace(
                "from sentence_transformers import SentenceTransformer",
                '# pip install -U "bertflow[st]"   (the Calibration module is bertflow\'s)\n'
                "from sentence_transformers import SentenceTransformer",
                1,
            )
        return snippet + "\n\n" + self.calibration_section()

    def calibration_section(self) -> str:
        """The card's "bertflow calibration" section (Markdown)."""
        loads = (
            "**no**: it needs bertflow installed and `trust_remote_code=True` (no code is read from the folder), "
            f"because {self.needs_bertflow}."
            if self.needs_bertflow
            else "**yes**: every module is sentence-transformers' own (the calibrator is a `Dense`), so plain "
            "`SentenceTransformer(path)` loads it without bertflow."
        )
        rows = [f"| {key} | {value} |" for key, value in self.facts]
        return "\n".join(
            [
                "### bertflow calibration",
                "",
                "The modules after the pooling apply a calibrator fitted **without labels** by "
                "[bertflow](https://pypi.org/project/bertflow/) on this model's pooled sentence embeddings.",
                "",
                "| | |",
                "|---|---|",
                *rows,
                "",
                f"Loads without bertflow: {loads}",
            ]
        )


def _card_data(
    module: Module, cal: Calibrator, pooling: str | None, facts: list[tuple[str, str]], **kwargs: Any
) -> BertflowModelCardData:
    """Card data for a model whose last calibration ``module`` computes ``cal`` after ``pooling`` (bertflow's name,
    ``None`` for a sentence-transformers model's own), with the fit record ``facts`` (see
    :class:`BertflowModelCardData`); ``kwargs`` go to it (``license``, ``local_files_only``)."""
    needs = None
    if isinstance(module, Calibration):
        needs = calibrator_needs_bertflow(cal, pooling) or "it was exported with portable=False (bertflow's module)"
    facts = [*facts, ("calibrator", f"`{cal!r}`"), ("labels used", "none (label-free)")]
    return BertflowModelCardData(facts=facts, needs_bertflow=needs, **kwargs)


def _fit_facts(fitting: dict[str, Any]) -> list[tuple[str, str]]:
    """The fit record's rows of the card: corpus size and sha256, regime."""
    sha = fitting.get("corpus_sha256")
    return [
        ("corpus size (sentences)", str(fitting.get("n_sentences", "unknown"))),
        ("corpus_sha256", f"`{sha}`" if sha else "unknown"),
        ("regime (fitting corpus)", str(fitting.get("regime", "unknown"))),
    ]


def encoder_config(model: SentenceTransformer) -> dict[str, Any]:
    """What a calibrator fitted on ``model``'s pooled embeddings depends on, in bertflow's encoder-config form.

    Returns:
        ``{"model", "revision", "pooling", "max_length", "dim", "fingerprint", "tokenizer_fingerprint",
        "framework"}``; the fingerprints are ``None`` when the first module is not a Hugging Face transformer with a
        (fast) tokenizer. ``model`` is the Hub id,
        or for a local checkpoint the Hub id sentence-transformers recognised or else the folder's name: never an
        absolute local path.
    """
    first = model[0]
    hf_model = getattr(first, "auto_model", None)
    tokenizer = getattr(first, "tokenizer", None)
    fingerprint = tokenizer_fp = None
    if hf_model is not None and tokenizer is not None:
        # The same function as SentenceEncoder.fingerprint: a calibrator fitted by either library is checked by either.
        fingerprint = weights_fingerprint(hf_model, tokenizer)
        tokenizer_fp = tokenizer_fingerprint(tokenizer) if getattr(tokenizer, "is_fast", False) else None
    pooling = _bertflow_pooling(model)
    name = getattr(getattr(hf_model, "config", None), "_name_or_path", None) or type(first).__name__
    if Path(name).is_absolute():
        # A local folder: its absolute path would publish the user's file system in a shared model and name nothing
        # on another machine. The Hub id sentence-transformers recognised, else the folder's own name.
        name = getattr(model.model_card_data, "base_model", None) or portable_model_name(name)
    return {
        "model": name,
        "revision": None,
        "pooling": pooling,
        "max_length": model.max_seq_length,
        "dim": _pooled_dim(model),
        "fingerprint": fingerprint,
        "tokenizer_fingerprint": tokenizer_fp,
        "framework": "sentence-transformers",
    }


def _bertflow_pooling(model: SentenceTransformer) -> str | list[int] | None:
    """The pooling of ``model``'s modules in bertflow's spec (what :func:`pooling_modules` exports back), or ``None``
    where token weights are applied (``WordWeights``: their statistics cannot be named from the model)."""
    names = [type(m).__name__ for m in model]
    if "WordWeights" in names:
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
    """A sentence-transformers module that maps ``features["sentence_embedding"]`` through a fitted calibrator.

    Place it after Pooling (and Dense, if any) and before a final ``Normalize``: see the module docstring. The
    output keeps the input's device and dtype; the calibrator computes in float32/float64 on its own device (the
    flow on CUDA when available), whatever the model's precision.

    Args:
        calibrator: a fitted bertflow calibrator (flow, whitening, ...), fitted on this model's pooled embeddings.
        fitting: optional record of how it was fitted (``n_sentences``, ``corpus_sha256``, ``regime``), saved in
            ``fitting.json``.
        fitted_on: optional record of the encoder it was fitted on (:func:`~bertflow.model_folder.encoder_record`),
            saved in ``fitted_on.json`` and compared with the model the module is loaded into.

    Example:
        >>> from sentence_transformers import SentenceTransformer
        >>> from sentence_transformers.base.modules import Normalize
        >>> base = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
        >>> pooled = SentenceTransformer(modules=list(base)[:-1])          # without the trailing Normalize
        >>> cal = WhiteningCalibrator(256).fit(pooled.encode(sentences))
        >>> model = SentenceTransformer(modules=[*pooled, Calibration(cal), Normalize()])
        >>> model.encode(["A man plays a guitar."]).shape
        (1, 256)
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
        """Replace ``features["sentence_embedding"]`` [B, D] by its calibration [B, D'] (same device and dtype).

        The calibrator runs in float32 on the embeddings' device (:meth:`Calibrator.torch_transform`).
        """
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
        """The module's state without the per-device functions ``forward`` caches: they are closures, which pickle
        cannot send (sentence-transformers' multi-process encoding pickles the model to each worker), and a worker
        builds its own on its first forward anyway."""
        state = dict(super().__getstate__())
        state.pop("_transforms", None)
        return state

    def get_embedding_dimension(self) -> int:
        """Dimension D' of the calibrated embeddings (smaller than D for e.g. ``whitening-256``)."""
        return int(self.calibrator.n_features_out_)

    def on_model_ready(self, model: Any) -> None:
        """Refuse a model whose transformer, pooling or truncation differs from what the calibrator was fitted on."""
        check_compatible(self.calibrator, model, self.fitted_on)

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        """Write ``config.json`` + ``model.safetensors`` (always safetensors), ``fitting.json`` and, when known,
        ``fitted_on.json``."""
        self.calibrator.save(output_path)
        write_json(Path(output_path) / FITTING_FILE, self.fitting)
        if self.fitted_on:
            write_json(Path(output_path) / FITTED_ON_FILE, self.fitted_on)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> Calibration:
        """Load the module folder (local, or a hub repo's subfolder) written by :meth:`save`.

        The calibrator class comes from bertflow's registry, named in its ``config.json``; nothing is imported
        from the folder.
        """
        folder = cls.load_dir_path(
            model_name_or_path,
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        folder_path = Path(folder)
        fitting = read_json(folder_path / FITTING_FILE) if (folder_path / FITTING_FILE).is_file() else {}
        fitted_on = read_json(folder_path / FITTED_ON_FILE) if (folder_path / FITTED_ON_FILE).is_file() else None
        return cls(Calibrator.load(folder_path), fitting=fitting, fitted_on=fitted_on)

    def __repr__(self) -> str:
        return f"Calibration({self.calibrator!r})"


def check_compatible(calibrator: Calibrator, model: SentenceTransformer, fitted_on: dict[str, Any] | None) -> None:
    """Raise :class:`CompatibilityError` if ``calibrator`` was fitted (as ``fitted_on`` records) on another encoder,
    pooling or truncation than ``model``'s."""
    if not fitted_on:
        return  # nothing recorded to check (the dimension is checked by Calibration.forward)

    def advice(key: str, recorded: Any) -> str:
        fix = f"set model.max_seq_length = {recorded}" if key == "max_length" else "refit with fit_calibrator"
        return f"{fix}, or use the model it was fitted on"

    check_fitted_on(calibrator, encoder_config(model), fitted_on, subject="this model", advice=advice)


def _resolve_calibrator(calibrator: str | Calibrator, calibrator_kwargs: dict[str, Any]) -> Calibrator:
    """The calibrator :func:`fit_calibrator` fits: a spec string parsed with ``calibrator_kwargs``, or the given
    unfitted :class:`Calibrator` (then without extra arguments)."""
    if isinstance(calibrator, str):
        return parse_calibrator(calibrator, **calibrator_kwargs)
    if isinstance(calibrator, Calibrator):
        if calibrator_kwargs:
            raise InputError("extra calibrator arguments only apply to a spec string; set them on the calibrator")
        return calibrator
    raise InputError(f"calibrator must be a spec string or a Calibrator, got {type(calibrator).__name__}")


def _calibration_module(
    cal: Calibrator, *, portable: bool, fitting: dict[str, Any], fitted_on: dict[str, Any] | None
) -> Module:
    """The module applying the fitted ``cal``: sentence-transformers' own ``Dense`` for an affine calibrator when
    ``portable``, else a :class:`Calibration` carrying the fitting record and what it was fitted on."""
    if portable and cal.is_affine():
        return as_dense(cal)
    return Calibration(cal, fitting=fitting, fitted_on=fitted_on)


def _calibrated_model(modules: list[Module], cal: Calibrator, **kwargs: Any) -> CalibratedSentenceTransformer:
    """The calibrated ``SentenceTransformer`` of ``modules`` (``kwargs``: device, card data, prompts), with cosine
    similarity and the ``bertflow`` and ``calibrator-<name>`` tags on its card."""
    # Cosine in the calibrated space is bertflow's similarity, whatever the base model declared.
    model = CalibratedSentenceTransformer(modules=modules, similarity_fn_name="cosine", **kwargs)
    add_tags = getattr(model.model_card_data, "add_tags", None)
    if callable(add_tags):
        add_tags(["bertflow", f"calibrator-{cal.name}"])
    return model


def fit_calibrator(
    model: SentenceTransformer,
    corpus: Sequence[str],
    calibrator: str | Calibrator = "flow",
    *,
    normalize: bool | None = None,
    batch_size: int = 128,
    show_progress_bar: bool | None = None,
    regime: str = "custom",
    portable: bool = True,
    **calibrator_kwargs: Any,
) -> SentenceTransformer:
    """Fit a calibrator on ``model``'s embeddings of ``corpus`` (no labels) and return the calibrated model.

    Args:
        model: a ``SentenceTransformer`` without a Calibration module. It is not modified; the returned model
            shares its modules (no weights are copied).
        corpus: unlabeled sentences to fit on (a list; duplicates weight the density).
        calibrator: a spec such as ``"flow"``, ``"flow-paper"``, ``"whitening"``, ``"whitening-256"`` (see
            :func:`bertflow.calibrators.parse_calibrator`), or an unfitted :class:`Calibrator`.
        normalize: end the pipeline with ``Normalize``; ``None`` keeps what ``model`` had.
        batch_size, show_progress_bar: for embedding the corpus (``None`` shows a bar for large corpora).
        regime: a label for the fitting corpus, saved in ``fitting.json``.
        portable: export an affine calibrator (see :func:`affine_map`) as sentence-transformers' own ``Dense``
            module, so the saved model reloads with plain ``SentenceTransformer(path)``, without bertflow and without
            ``trust_remote_code``. It then carries no fitting record and no encoder check. ``False`` keeps the
            :class:`Calibration` module. Non-affine calibrators (flow, anchored, auto) always use Calibration.
        calibrator_kwargs: extra arguments for a spec string, e.g. ``seed=1`` or ``verbose=True`` for the flow.

    Returns:
        A new ``SentenceTransformer``: ``model``'s modules up to pooling/Dense, :class:`Calibration` (or, for a
        portable affine calibrator, a ``Dense``), and ``Normalize`` if asked; cosine similarity; ``model``'s prompts.

    Raises:
        InputError: blank or non-string sentences, a model that is already calibrated, a bad spec.
    """
    if isinstance(corpus, str):
        raise InputError("corpus must be a list of sentences, not one string")
    items = validate_sentences(corpus)
    modules = list(model)
    if any(isinstance(m, Calibration) for m in modules):
        raise InputError("this model already has a Calibration module; fit on the uncalibrated model")
    had_normalize = bool(modules) and isinstance(modules[-1], Normalize)
    base_modules = modules[:-1] if had_normalize else modules
    cal = _resolve_calibrator(calibrator, calibrator_kwargs)
    common: dict[str, Any] = {
        "device": str(model.device),
        "prompts": dict(model.prompts),
        "default_prompt_name": model.default_prompt_name,
    }
    # The calibrator must see what it will be applied to: the pooled vectors before any normalisation.
    pooled = SentenceTransformer(modules=base_modules, **common)
    started = time.perf_counter()
    X = pooled.encode(items, batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_numpy=True)
    logger.info("fitting %r on %d embeddings of dimension %d", cal, X.shape[0], X.shape[1])
    cal.fit(np.asarray(X, dtype=np.float32))
    fitted_on = encoder_record(encoder_config(model), framework="sentence-transformers")
    fitting = fit_record(
        len(items),
        corpus_sha256=corpus_digest(items),
        regime=regime,
        seconds=time.perf_counter() - started,
        device=model.device,
    )
    keep_normalize = had_normalize if normalize is None else normalize
    module = _calibration_module(cal, portable=portable, fitting=fitting, fitted_on=fitted_on)
    new_modules = [*base_modules, module]
    if keep_normalize:
        new_modules.append(Normalize())
    facts = [("encoder", f"`{fitted_on['model']}`"), ("pooling", f"`{fitted_on['pooling']}`"), *_fit_facts(fitting)]
    card = _card_data(module, cal, None, facts)
    card.base_model = getattr(model.model_card_data, "base_model", None)
    card.base_model_revision = getattr(model.model_card_data, "base_model_revision", None)
    common["model_card_data"] = card
    return _calibrated_model(new_modules, cal, **common)


def from_embedder(embedder: Embedder, *, normalize: bool = False, portable: bool = True) -> SentenceTransformer:
    """A ``SentenceTransformer`` computing what ``embedder.encode`` computes.

    The pipeline is ``Transformer`` (the encoder's checkpoint, ``max_seq_length`` = its ``max_length``) -> the
    pooling as sentence-transformers' own modules (:func:`pooling_modules`) -> the calibrator (a ``Dense`` for an
    affine one when ``portable``; anchored whitening or auto after a token-averaging pooling as built-in modules,
    :mod:`.st_anchored`; else a :class:`Calibration` module) [-> ``Normalize``], on the encoder's device,
    with cosine similarity. The calibrator is copied, so refitting the Embedder later leaves the model alone. The
    module's construction check (:meth:`Calibration.on_model_ready`) compares the checkpoint's weight fingerprint,
    pooling and truncation with what the calibrator was fitted on.

    Args:
        embedder: a fitted :class:`~bertflow.Embedder` whose encoder was loaded from a checkpoint (a hub id or a
            folder).
        normalize: end with ``Normalize`` (unit vectors; cosine unchanged). ``False`` returns exactly the
            Embedder's vectors.
        portable: export an affine calibrator as sentence-transformers' own ``Dense`` (see :func:`fit_calibrator`).

    Returns:
        the new model; ``model.encode(s)`` equals ``embedder.encode(s)`` to float32 rounding of the two libraries'
        poolings (about 1e-5 in cosine).

    Raises:
        InputError: a pooling sentence-transformers' modules cannot express (``pooler``, a pooling added to
            bertflow), or an encoder built from a model object rather than a checkpoint.
    """
    import copy

    try:  # sentence-transformers >= 6
        from sentence_transformers.base.modules import Transformer
    except ImportError:  # pragma: no cover - sentence-transformers 5
        from sentence_transformers.models import Transformer

    embedder.check_fitted()
    encoder = embedder.encoder
    pooling = pooling_modules(encoder)  # refuses what cannot be expressed, before any model is built
    folder = encoder.source_dir
    if folder is None:
        raise InputError(
            f"the encoder {encoder.model_id!r} was built from a model object, so there is no checkpoint for "
            "sentence-transformers to load; save it with save_pretrained and build the encoder from that folder"
        )
    cal = copy.deepcopy(embedder.calibrator)
    fit_info, fitted_on = embedder.fit_records()
    if fitted_on:  # a model saved before records named local folders without their path
        fitted_on = {**fitted_on, "model": portable_model_name(str(fitted_on["model"]))}
    fitting = {k: fit_info[k] for k in ("n_sentences", "corpus_sha256", "regime") if k in fit_info}
    anchored = anchored_modules(cal, encoder, pooling) if portable else None
    if anchored is not None:
        calibration = anchored  # sentence-transformers' own modules (st_anchored)
    else:
        calibration = [_calibration_module(cal, portable=portable, fitting=fitting, fitted_on=fitted_on)]
    module = calibration[-1]
    kwargs: dict[str, Any] = {"model_kwargs": {"dtype": encoder.dtype}}
    if len(pooling) > 1 or anchored is not None:
        # WeightedLayerPooling reads every layer (all_layer_embeddings); WordWeights and the anchored modules need
        # padded [B, T, D] token states: both saved in the folder (the HF config's output_hidden_states, the
        # module's unpad_inputs).
        kwargs.update(unpad_inputs=False)
        if len(pooling) > 1:
            kwargs.update(config_kwargs={"output_hidden_states": True})
    transformer = Transformer(str(folder), max_seq_length=encoder.max_length, **kwargs)
    modules = [transformer, *pooling, *calibration, *([Normalize()] if normalize else [])]
    facts, extra = _embedder_facts(embedder), _licence_and_source(embedder)
    card = _card_data(module, cal, encoder.pooling.name, facts, **extra)
    enc = pinned_encoder_config(encoder)
    if on_hub(enc):  # the Hub links base_model to the encoder's page; a local folder has none
        card.base_model = enc["model"]
        card.base_model_revision = enc.get("revision")
    return _calibrated_model(modules, cal, device=str(encoder.device), model_card_data=card)


def _embedder_facts(embedder: Embedder) -> list[tuple[str, str]]:
    """The card's rows for an exported Embedder: encoder (publishable name, revision), pooling, fit record,
    licences."""
    enc = pinned_encoder_config(embedder.encoder)
    licence = encoder_license(embedder)
    return [
        ("encoder", encoder_reference(enc)),
        ("pooling", f"`{enc['pooling']}`"),
        ("max_length (tokens)", str(enc["max_length"])),
        *_fit_facts(embedder.fit_info),
        (
            "licence",
            "calibration: Apache-2.0 (bertflow); the encoder's weights in this folder: "
            + (f"`{licence}` (as its files declare)" if licence else "not declared in its files (see its own card)"),
        ),
    ]


def _licence_and_source(embedder: Embedder) -> dict[str, Any]:
    """The card's ``license`` (the folder holds the encoder's weights, so its licence governs unless it is
    Apache-2.0 like the calibration: ``other`` then; ``None`` when undeclared) and, for a local encoder,
    ``local_files_only`` (sentence-transformers would otherwise look up its folder's name on the Hub)."""
    licence = encoder_license(embedder)
    return {
        "license": None if licence is None else ("apache-2.0" if licence == "apache-2.0" else "other"),
        "local_files_only": not on_hub(pinned_encoder_config(embedder.encoder)),
    }


def pooling_modules(encoder: SentenceEncoder) -> list[Module]:
    """``encoder``'s pooling as sentence-transformers' own modules, which compute the same vectors without bertflow.

    * ``cls``, ``mean``: ``Pooling`` in that mode.
    * ``first-last-avg``, ``last2avg``, index lists: ``WeightedLayerPooling`` (weight 1 on each averaged layer,
      0 on the others from the lowest one up; the ``Transformer`` must return every layer) then ``Pooling`` mean.
    * a weighted pooling (``sif:``, ``usif:``, ``idf:``): the above with ``WordWeights`` (one weight per token of
      the vocabulary, this encoder's table) before the mean, which ``Pooling`` then divides by the summed weights,
      as bertflow's weighted mean does.

    Raises:
        InputError: ``pooler`` (sentence-transformers' ``Pooling`` has no pooler head), a pooling added to bertflow
            that none of these express, or a vocabulary whose duplicate token strings carry different weights
            (``WordWeights`` is keyed by token string).
    """
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Pooling, WeightedLayerPooling, WordWeights
    except ImportError:  # pragma: no cover - sentence-transformers 5
        from sentence_transformers.models import Pooling, WeightedLayerPooling, WordWeights

    pooling, dim, top = encoder.pooling, encoder.dim, encoder.num_layers
    if pooling.base_name == "cls":
        return [Pooling(dim, "cls")]
    if not pooling.portable or not isinstance(pooling, LayerMeanPooling):
        raise InputError(
            f"pooling {pooling.name!r} has no sentence-transformers equivalent (its modules express cls, mean, "
            "first-last-avg, last2avg, layer lists and their sif/usif/idf weightings); fit with one of those to export"
        )
    modules: list[Module] = []
    if pooling.layers != (top,):
        start = min(pooling.layers)
        # A Parameter, as the module's own default: it is saved in (and loaded from) the module's safetensors.
        layer_weights = torch.tensor([float(i in pooling.layers) for i in range(start, top + 1)])
        weights = torch.nn.Parameter(layer_weights, requires_grad=False)
        modules.append(WeightedLayerPooling(dim, num_hidden_layers=top, layer_start=start, layer_weights=weights))
    if pooling.weighting.weighted:
        modules.append(_word_weights(encoder, WordWeights))
    return [*modules, Pooling(dim, "mean")]


def _word_weights(encoder: SentenceEncoder, word_weights: type[Module]) -> Module:
    """sentence-transformers' ``WordWeights`` holding ``encoder``'s per-token weights, checked id by id."""
    stats = encoder.token_statistics
    if stats is None:
        raise InputError(f"pooling {encoder.pooling.name!r} has no token statistics yet: fit the Embedder first")
    table = encoder.pooling.weighting.table(stats)
    vocab = encoder.tokenizer.convert_ids_to_tokens(list(range(encoder.vocab_size)))
    # An id the tokenizer cannot produce (its string listed twice in vocab.txt) maps to None, which the module's JSON
    # config cannot key: a placeholder string of its own keeps its (never used) weight.
    vocab = [f"[bertflow-unreachable-{i}]" if token is None else token for i, token in enumerate(vocab)]
    module = word_weights(vocab=vocab, word_weights={t: float(w) for t, w in zip(vocab, table, strict=True)})
    if not torch.equal(module.emb_layer.weight.detach()[:, 0], torch.from_numpy(table)):
        raise InputError(
            "the tokenizer's vocabulary repeats token strings with different weights, which sentence-transformers' "
            "WordWeights (keyed by token string) cannot express; this weighted pooling cannot be exported"
        )
    return module


CALIBRATION_TYPE = f"{__name__}.Calibration"


def check_module_list(folder: str | Path) -> None:
    """Refuse a saved sentence-transformers folder whose ``modules.json`` does not match its module folders: a
    listed module whose folder is missing (sentence-transformers would fail with a traceback), or a calibration
    module folder (with bertflow's ``fitting.json``) that ``modules.json`` no longer lists, which would load an
    uncalibrated model without a word.

    Raises:
        ModelFileError: naming the module and the folder.
    """
    root = Path(folder)
    try:
        entries = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return  # a bare transformer folder: sentence-transformers adds mean pooling itself
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{root / 'modules.json'} is not valid JSON ({e})") from None
    listed = set()
    for entry in entries if isinstance(entries, list) else []:
        path = str(entry.get("path", "")) if isinstance(entry, dict) else ""
        listed.add(path)
        if path and not (root / path).is_dir():
            raise ModelFileError(
                f"modules.json in {root} lists the module {entry.get('type')!r} in {path}/, which is missing: the "
                "saved model is incomplete; export it again"
            )
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and (p / FITTING_FILE).is_file()):
        if sub.name not in listed:
            raise ModelFileError(
                f"{sub} holds a bertflow calibration module that modules.json in {root} does not list: loading would "
                "give the uncalibrated model; restore its entry or export the model again"
            )


def check_no_code(folder: str | Path) -> None:
    """Refuse a saved sentence-transformers folder that could run code under ``trust_remote_code=True``.

    The flag is global to a load: besides letting sentence-transformers import bertflow's :class:`Calibration`, it
    lets transformers run a repository's own modeling files. A folder passes when it holds no ``*.py`` file, no
    JSON config (at the top or in a module folder) has an ``auto_map``, and ``modules.json`` names only
    sentence-transformers' classes and bertflow's Calibration.

    Raises:
        ModelFileError: naming the first offending file.
    """
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
    if (root / "modules.json").is_file():
        try:
            entries = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFileError(f"{root / 'modules.json'} is not valid JSON ({e})") from None
        for entry in entries if isinstance(entries, list) else []:
            kind = str(entry.get("type", "")) if isinstance(entry, dict) else ""
            if not (kind.startswith("sentence_transformers.") or kind == CALIBRATION_TYPE):
                raise ModelFileError(
                    f"modules.json in {root} names the module class {kind!r}, which is neither "
                    "sentence-transformers' nor bertflow's; refusing to import it"
                )


def load_calibrated(
    model_name_or_path: str, *, revision: str | None = None, token: bool | str | None = None, **kwargs: Any
) -> SentenceTransformer:
    """Load a saved calibrated ``SentenceTransformer`` (local folder or Hub id) after :func:`check_no_code`.

    A model with a :class:`Calibration` module needs ``trust_remote_code=True`` (sentence-transformers >= 6
    imports no class outside its namespace without it), and that flag would also run code shipped in the
    repository. This loader fetches the files first (no code runs), refuses any folder that could run code, and
    only then loads with the flag. Keyword arguments go to ``SentenceTransformer`` (``device=...``).

    Raises:
        ModelFileError: the folder holds code, an ``auto_map`` or a foreign module class; a module it lists is
            missing, or a calibration module is there but not listed (see :func:`check_module_list`); a file the
            export wrote is missing or altered (:func:`verify_export_checksums`); the Hub repo cannot be fetched.
    """
    folder = Path(model_name_or_path).expanduser()
    if not folder.is_dir():
        from ..hub import snapshot

        folder = snapshot(model_name_or_path, revision, token=token)  # one-line errors: offline, not found ...
    check_no_code(folder)
    check_module_list(folder)
    verify_export_checksums(folder)
    kwargs.pop("trust_remote_code", None)
    return SentenceTransformer(str(folder), trust_remote_code=True, token=token, **kwargs)
