"""The ``auto`` rule's fit, in one place: which poolings it reads and what it chooses from them.

:class:`~bertflow.calibrators.auto.AutoCalibrator` decides the calibration from embeddings; on a raw MLM encoder the
rule also switches a token-averaging pooling to its SIF-weighted form, counted on the shipped generic token prior
(:mod:`bertflow.encoding.token_prior`). That second half needs the encoder, so it lives here, above both the
encoder and the calibrators, and every caller goes through it: ``Embedder.fit`` (one forward pass) and the
evaluation grid's ``auto`` cells (:mod:`bertflow.paper.grid`, :mod:`bertflow.paper.perset`, from the embedding
cache). Use:

1. :func:`auto_inputs` says which poolings to encode the fitting sentences with (the calibrated pooling, ``mean``
   for the token anisotropy, and the prior-weighted pooling where a prior fits the tokenizer);
2. the caller encodes them (the weighted one with ``encoder.token_statistics = inputs.prior.statistics``);
3. :func:`fit_auto` reads the token anisotropy, fits the calibrator on the chosen pooling and says what it chose.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .calibrators.anchored import anisotropy
from .calibrators.auto import WEIGHTING, AutoCalibrator
from .encoding.encoder import SentenceEncoder
from .encoding.pooling import Pooling
from .encoding.token_prior import TokenPrior, prior_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoInputs:
    """The poolings the ``auto`` rule reads for one calibrated pooling.

    Attributes:
        own: the pooling to calibrate.
        mean: last-layer ``mean`` pooling, whose anisotropy is the token anisotropy (the rawness statistic).
        weighted: ``own``'s SIF-weighted form, for a raw encoder; ``None`` when no prior applies (the pooling does
            not average tokens, is weighted already, weighting was not allowed, or no shipped prior has the
            tokenizer's exact vocabulary).
        prior: the token prior ``weighted`` is counted on (set it as the encoder's ``token_statistics`` while
            encoding ``weighted``); ``None`` with ``weighted``.
    """

    own: Pooling
    mean: Pooling
    weighted: Pooling | None = None
    prior: TokenPrior | None = field(default=None, repr=False)

    def poolings(self) -> list[Pooling]:
        """The distinct poolings to encode, in order: ``own``, ``mean`` (unless it is ``own``), ``weighted``."""
        out = {p.key: p for p in (self.own, self.mean, self.weighted) if p is not None}
        return list(out.values())


def auto_inputs(encoder: SentenceEncoder, pooling: Pooling | None = None, *, weigh: bool = True) -> AutoInputs:
    """What :func:`fit_auto` needs encoded for ``pooling`` (default: the encoder's own) on ``encoder``.

    Args:
        encoder: the encoder (its tokenizer picks the prior, its depth parses the poolings).
        pooling: the pooling to calibrate.
        weigh: whether the rule may switch to a weighted pooling (``Embedder.fit`` passes ``False`` when the user
            gave token statistics of their own).
    """
    own = pooling if pooling is not None else encoder.pooling
    mean = Pooling.parse("mean", encoder.num_layers)
    if not (weigh and own.averages_tokens and not own.weighting.weighted):
        return AutoInputs(own, mean)
    prior = prior_for(encoder.tokenizer)
    if prior is None:
        return AutoInputs(own, mean)
    spec = own.base_spec()
    weighted = f"{WEIGHTING}:{spec if isinstance(spec, str) else ','.join(map(str, spec))}"
    return AutoInputs(own, mean, Pooling.parse(weighted, encoder.num_layers), prior)


@dataclass
class AutoFit:
    """What :func:`fit_auto` chose.

    Attributes:
        pooling: the pooling the calibrator was fitted on (``inputs.own`` or ``inputs.weighted``).
        prior: the token prior of that pooling when it is the weighted one, else ``None``.
        embeddings: the fitting embeddings [N, D] under ``pooling``.
        choice: the record saved with the model (fit record, model card) and in evaluation reports:
            ``token_anisotropy`` (rounded to 4 places), ``weighting`` (``"none"`` or the weighting),
            ``token_statistics`` (where the weights' counts come from, when weighted) and ``calibrator``
            (:meth:`AutoCalibrator.describe`).
    """

    pooling: Pooling
    prior: TokenPrior | None
    embeddings: np.ndarray
    choice: dict[str, Any]


def fit_auto(calibrator: AutoCalibrator, inputs: AutoInputs, embed: Callable[[Pooling], np.ndarray]) -> AutoFit:
    """Fit ``calibrator`` as the ``auto`` rule says, on the fitting sentences that ``embed`` returns.

    Args:
        calibrator: the unfitted or fitted :class:`AutoCalibrator` (refitted here).
        inputs: from :func:`auto_inputs`.
        embed: the fitting sentences' embeddings [N, D] under one of ``inputs.poolings()`` (the weighted one
            counted on ``inputs.prior``), e.g. a lookup in one forward pass's output or in the embedding cache.
            Called for ``mean`` first, then for the pooling chosen.

    Returns:
        The choice; on a raw encoder (rawness >= 0.5) with a weighted pooling available, that pooling.
    """
    token_anisotropy = anisotropy(embed(inputs.mean))
    raw_encoder = calibrator.rawness(token_anisotropy) >= 0.5
    choice: dict[str, Any] = {"token_anisotropy": round(token_anisotropy, 4), "weighting": "none"}
    if inputs.weighted is not None and inputs.prior is not None and raw_encoder:
        pooling, prior = inputs.weighted, inputs.prior
        choice.update(weighting=WEIGHTING, token_statistics=f"prior {prior.name}: {prior.source}")
    else:
        pooling, prior = inputs.own, None
    X = embed(pooling)
    calibrator.fit(X, token_anisotropy=token_anisotropy)
    choice["calibrator"] = calibrator.describe()
    logger.info("auto: pooling %s; %s", pooling.name, choice["calibrator"])
    return AutoFit(pooling, prior, X, choice)
