"""The ``auto`` rule's fit, in one place: which poolings it reads and what it chooses from them.

:class:`~bertflow.calibrators.auto.AutoCalibrator` decides the calibration from embeddings; on a raw MLM encoder the
rule also switches a token-averaging pooling to its SIF-weighted form, counted on the shipped generic token prior.
That half needs the encoder, so it lives here: the caller encodes the poolings :func:`auto_inputs` names, then
:func:`fit_auto` chooses and fits.
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
    """The poolings the ``auto`` rule reads for the pooling it calibrates (``own``): last-layer ``mean`` (whose
    anisotropy is the rawness statistic) and, where a shipped ``prior`` has the tokenizer's vocabulary and ``own``
    averages unweighted tokens, ``own``'s SIF-weighted form (encode it with the prior as token statistics)."""

    own: Pooling
    mean: Pooling
    weighted: Pooling | None = None
    prior: TokenPrior | None = field(default=None, repr=False)

    def poolings(self) -> list[Pooling]:
        """The distinct poolings to encode, in order: ``own``, ``mean`` (unless it is ``own``), ``weighted``."""
        out = {p.key: p for p in (self.own, self.mean, self.weighted) if p is not None}
        return list(out.values())


def auto_inputs(encoder: SentenceEncoder, pooling: Pooling | None = None, *, weigh: bool = True) -> AutoInputs:
    """What :func:`fit_auto` needs encoded for ``pooling`` (default: the encoder's own) on ``encoder`` (whose
    tokenizer picks the prior); ``weigh=False`` (the user gave token statistics) forbids a weighted pooling."""
    own = pooling if pooling is not None else encoder.pooling
    mean = Pooling.parse("mean", encoder.num_layers)
    weighable = weigh and own.averages_tokens and not own.weighting.weighted
    prior = prior_for(encoder.tokenizer) if weighable else None
    if prior is None:
        return AutoInputs(own, mean)
    spec = own.base_spec()
    weighted = f"{WEIGHTING}:{spec if isinstance(spec, str) else ','.join(map(str, spec))}"
    return AutoInputs(own, mean, Pooling.parse(weighted, encoder.num_layers), prior)


@dataclass
class AutoFit:
    """What :func:`fit_auto` chose: the ``pooling`` fitted on (with its token ``prior`` when weighted), the fitting
    ``embeddings`` [N, D] under it, and ``choice``, the record saved with the model and in reports
    (``token_anisotropy``, ``weighting``, ``token_statistics`` when weighted, ``calibrator``: its describe())."""

    pooling: Pooling
    prior: TokenPrior | None
    embeddings: np.ndarray
    choice: dict[str, Any]


def fit_auto(calibrator: AutoCalibrator, inputs: AutoInputs, embed: Callable[[Pooling], np.ndarray]) -> AutoFit:
    """(Re)fit ``calibrator`` as the ``auto`` rule says: ``embed(pooling)`` gives the fitting sentences'
    embeddings [N, D] under one of ``inputs.poolings()`` (:func:`auto_inputs`), called for ``mean`` first, then for
    the pooling chosen (the weighted one on a raw encoder, rawness >= 0.5, where available)."""
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
