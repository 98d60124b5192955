"""Exporting to sentence-transformers: a ``SentenceTransformer`` whose pipeline ends in a bertflow calibration, from
a ``SentenceTransformer`` and a corpus (:func:`fit_calibrator`) or from a fitted Embedder (:func:`from_embedder`).

The calibrator is fitted on, and applied to, the *unnormalised* pooled vectors: after Pooling (and any Dense),
before a trailing ``Normalize``. Affine calibrators become sentence-transformers' own ``Dense`` (:func:`as_dense`),
anchored whitening and auto after a token-averaging pooling a chain of built-in modules (:mod:`.st_anchored`): both
load without bertflow. The others become bertflow's :class:`~.sentence_transformers.Calibration` module.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

try:  # sentence-transformers >= 6
    from sentence_transformers.base.modules import Dense, Module, Normalize, Transformer
    from sentence_transformers.sentence_transformer.model_card import SentenceTransformerModelCardData
    from sentence_transformers.sentence_transformer.modules import Pooling, WeightedLayerPooling, WordWeights
except ImportError:  # pragma: no cover - sentence-transformers 5
    from sentence_transformers.model_card import SentenceTransformerModelCardData
    from sentence_transformers.models import (
        Dense,
        Module,
        Normalize,
        Pooling,
        Transformer,
        WeightedLayerPooling,
        WordWeights,
    )

from ..calibrators import Calibrator, parse_calibrator
from ..card import encoder_license, encoder_reference, on_hub
from ..embedder import Embedder
from ..encoding.encoder import SentenceEncoder
from ..encoding.loading import portable_model_name
from ..encoding.pooling.layers import LayerMeanPooling
from ..errors import InputError
from ..io.formats import sha256_file, write_json
from ..model_folder import corpus_digest, encoder_record, fit_record, pinned_encoder_config
from ..portability import calibrator_needs_bertflow
from ..validation import validate_sentences
from .sentence_transformers import CHECKSUM_FILE, CHECKSUM_FORMAT, Calibration, encoder_config
from .st_anchored import anchored_modules

logger = logging.getLogger(__name__)


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
        write_json(folder / CHECKSUM_FILE, {"format": CHECKSUM_FORMAT, "files": files})


def affine_map(calibrator: Calibrator) -> tuple[np.ndarray, np.ndarray]:
    """The fitted ``calibrator`` as one affine map ``x -> x @ W + b`` (float64): ``(W [D, D'], b [D'])``, a chain's
    steps composed. InputError where ``calibrator.is_affine()`` is false."""
    calibrator.check_fitted()
    if not calibrator.is_affine():
        raise InputError(
            f"{type(calibrator).__name__} is not an affine map, so it has no Dense equivalent; use the Calibration "
            "module (loading then needs bertflow and trust_remote_code=True)"
        )
    # Each step's map is affine and computes in float64 (transform64), so probing it at 0 and at the unit vectors reads
    # off b and W exactly (to float64 rounding), the same way for every class and for the composition.
    d = calibrator.n_features_in_
    probes = np.vstack([np.zeros((1, d)), np.eye(d)])
    out = calibrator.transform64(probes)
    return out[1:] - out[0], out[0]


def as_dense(calibrator: Calibrator) -> Dense:
    """A sentence-transformers ``Dense`` module computing the affine ``calibrator`` to float32 rounding."""
    W, b = affine_map(calibrator)
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
    """Model card data of a model that ends in a bertflow calibration: after sentence-transformers' usage snippet, a
    "bertflow calibration" section with the fit record (``facts``) and whether the folder loads without bertflow,
    and if not why (``needs_bertflow``: the snippet then also installs bertflow and passes ``trust_remote_code``)."""

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
    ``None`` for a sentence-transformers model's own), with the fit record ``facts``."""
    needs = None
    if isinstance(module, Calibration):
        needs = calibrator_needs_bertflow(cal, pooling) or "it was exported with portable=False (bertflow's module)"
    facts = [*facts, ("calibrator", f"`{cal!r}`"), ("labels used", "none (label-free)")]
    return BertflowModelCardData(facts=facts, needs_bertflow=needs, **kwargs)


def _fit_facts(fitting: dict[str, Any]) -> list[tuple[str, str]]:
    """The fit record's rows of the card."""
    sha = fitting.get("corpus_sha256")
    return [
        ("corpus size (sentences)", str(fitting.get("n_sentences", "unknown"))),
        ("corpus_sha256", f"`{sha}`" if sha else "unknown"),
        ("regime (fitting corpus)", str(fitting.get("regime", "unknown"))),
    ]


def _calibration_module(
    cal: Calibrator, *, portable: bool, fitting: dict[str, Any], fitted_on: dict[str, Any] | None
) -> Module:
    """The module applying the fitted ``cal``: sentence-transformers' own ``Dense`` for an affine calibrator when
    ``portable``, else a :class:`Calibration` carrying the fitting record and what it was fitted on."""
    if portable and cal.is_affine():
        return as_dense(cal)
    return Calibration(cal, fitting=fitting, fitted_on=fitted_on)


def _calibrated_model(modules: list[Module], cal: Calibrator, **kwargs: Any) -> CalibratedSentenceTransformer:
    """The calibrated ``SentenceTransformer`` of ``modules``, with cosine similarity (bertflow's, whatever the base
    model declared) and the ``bertflow`` and ``calibrator-<name>`` tags on its card."""
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
    """Fit a calibrator on ``model``'s pooled embeddings of ``corpus`` (unlabeled sentences, a list; duplicates
    weight the density) and return the calibrated model: ``model``'s modules up to pooling/Dense (shared, not copied;
    ``model`` is not modified), the calibration module, and ``Normalize`` if ``normalize`` (``None`` keeps what
    ``model`` had); cosine similarity; ``model``'s prompts.

    ``calibrator``: a spec (:func:`bertflow.calibrators.parse_calibrator`, with ``calibrator_kwargs`` such as
    ``seed=1``) or an unfitted :class:`Calibrator`; ``regime``: a label for the fitting corpus, saved in
    ``fitting.json``; ``portable``: an affine calibrator becomes sentence-transformers' own ``Dense`` (loads without
    bertflow, but carries no fitting record and no encoder check), ``False`` keeps :class:`Calibration`.
    """
    items = validate_sentences(corpus)  # refuses a single string too
    modules = list(model)
    if any(isinstance(m, Calibration) for m in modules):
        raise InputError("this model already has a Calibration module; fit on the uncalibrated model")
    had_normalize = bool(modules) and isinstance(modules[-1], Normalize)
    base_modules = modules[:-1] if had_normalize else modules
    cal = parse_calibrator(calibrator, **calibrator_kwargs) if isinstance(calibrator, str) else calibrator
    if not isinstance(cal, Calibrator) or (calibrator_kwargs and cal is calibrator):
        extra = " with extra arguments (set them on the calibrator)" if calibrator_kwargs else ""
        raise InputError(f"calibrator must be a spec string or a Calibrator, got {type(calibrator).__name__}{extra}")
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
    module = _calibration_module(cal, portable=portable, fitting=fitting, fitted_on=fitted_on)
    normalize = had_normalize if normalize is None else normalize
    new_modules = [*base_modules, module, *([Normalize()] if normalize else [])]
    facts = [("encoder", f"`{fitted_on['model']}`"), ("pooling", f"`{fitted_on['pooling']}`"), *_fit_facts(fitting)]
    card = _card_data(module, cal, None, facts)
    card.base_model = getattr(model.model_card_data, "base_model", None)
    card.base_model_revision = getattr(model.model_card_data, "base_model_revision", None)
    common["model_card_data"] = card
    return _calibrated_model(new_modules, cal, **common)


def from_embedder(embedder: Embedder, *, normalize: bool = False, portable: bool = True) -> SentenceTransformer:
    """A ``SentenceTransformer`` computing what ``embedder.encode`` computes (to float32 rounding of the two
    libraries' poolings, about 1e-5 in cosine), on the encoder's device, with cosine similarity.

    The pipeline is ``Transformer`` (the encoder's checkpoint, ``max_seq_length`` = its ``max_length``) -> the
    pooling as sentence-transformers' own modules (:func:`pooling_modules`) -> the calibrator (``Dense``, the
    :mod:`.st_anchored` chain or :class:`Calibration`; copied, so refitting the Embedder later leaves the model
    alone) [-> ``Normalize`` with ``normalize``]. ``portable=False`` keeps bertflow's :class:`Calibration` for every
    calibrator. InputError for a pooling sentence-transformers' modules cannot express or an encoder built from a
    model object rather than a checkpoint.
    """
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
    anchored = anchored_modules(cal, encoder, pooling) if portable else None  # sentence-transformers' own modules
    calibration = anchored or [_calibration_module(cal, portable=portable, fitting=fitting, fitted_on=fitted_on)]
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
    card = _embedder_card(embedder, calibration[-1], cal)
    return _calibrated_model(modules, cal, device=str(encoder.device), model_card_data=card)


def _embedder_card(embedder: Embedder, module: Module, cal: Calibrator) -> BertflowModelCardData:
    """The card of an exported Embedder: rows for the encoder (publishable name, revision), pooling, fit record and
    licences; ``license`` (the folder holds the encoder's weights, so their licence governs unless it is Apache-2.0
    like the calibration: ``other`` then; none when undeclared); a Hub encoder as ``base_model``, a local one with
    ``local_files_only`` (sentence-transformers would otherwise look its folder's name up on the Hub)."""
    enc, licence = pinned_encoder_config(embedder.encoder), encoder_license(embedder)
    declared = f"`{licence}` (as its files declare)" if licence else "not declared in its files (see its own card)"
    facts = [
        ("encoder", encoder_reference(enc)),
        ("pooling", f"`{enc['pooling']}`"),
        ("max_length (tokens)", str(enc["max_length"])),
        *_fit_facts(embedder.fit_info),
        ("licence", f"calibration: Apache-2.0 (bertflow); the encoder's weights in this folder: {declared}"),
    ]
    spdx = None if licence is None else ("apache-2.0" if licence == "apache-2.0" else "other")
    card = _card_data(module, cal, embedder.encoder.pooling.name, facts, license=spdx, local_files_only=not on_hub(enc))
    if on_hub(enc):  # the Hub links base_model to the encoder's page
        card.base_model, card.base_model_revision = enc["model"], enc.get("revision")
    return card


def pooling_modules(encoder: SentenceEncoder) -> list[Module]:
    """``encoder``'s pooling as sentence-transformers' own modules, which compute the same vectors without bertflow.

    * ``cls``, ``mean``: ``Pooling`` in that mode.
    * ``first-last-avg``, ``last2avg``, index lists: ``WeightedLayerPooling`` (weight 1 on each averaged layer,
      0 on the others from the lowest one up; the ``Transformer`` must return every layer) then ``Pooling`` mean.
    * a weighted pooling (``sif:``, ``usif:``, ``idf:``): the above with ``WordWeights`` (one weight per token of
      the vocabulary, this encoder's table) before the mean, which ``Pooling`` then divides by the summed weights,
      as bertflow's weighted mean does.

    InputError for any other pooling (``pooler``: ``Pooling`` has no pooler head), or a vocabulary whose duplicate
    token strings carry different weights (``WordWeights`` is keyed by token string).
    """
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
        modules.append(_word_weights(encoder))
    return [*modules, Pooling(dim, "mean")]


def _word_weights(encoder: SentenceEncoder) -> Module:
    """sentence-transformers' ``WordWeights`` holding ``encoder``'s per-token weights, checked id by id."""
    stats = encoder.token_statistics
    if stats is None:
        raise InputError(f"pooling {encoder.pooling.name!r} has no token statistics yet: fit the Embedder first")
    table = encoder.pooling.weighting.table(stats)
    vocab = encoder.tokenizer.convert_ids_to_tokens(list(range(encoder.vocab_size)))
    # An id the tokenizer cannot produce (its string listed twice in vocab.txt) maps to None, which the module's JSON
    # config cannot key: a placeholder string of its own keeps its (never used) weight.
    vocab = [f"[bertflow-unreachable-{i}]" if token is None else token for i, token in enumerate(vocab)]
    module = WordWeights(vocab=vocab, word_weights={t: float(w) for t, w in zip(vocab, table, strict=True)})
    if not torch.equal(module.emb_layer.weight.detach()[:, 0], torch.from_numpy(table)):
        raise InputError(
            "the tokenizer's vocabulary repeats token strings with different weights, which sentence-transformers' "
            "WordWeights (keyed by token string) cannot express; this weighted pooling cannot be exported"
        )
    return module
