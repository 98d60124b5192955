"""Frequency weighting of tokens inside an averaging pooling: ``none``, ``sif``, ``usif`` and ``idf``.

A weighting turns :class:`~bertflow.encoding.token_stats.TokenStatistics` (counted on unlabeled text) into one
weight per token id, float32 [V]; a weighted pooling averages token states with those weights::

    v = sum_t w(t) m_t h_t / sum_t w(t) m_t        (m: attention mask, h: token states)

a weighted *mean* (the weights are normalised per sentence, as sentence-transformers' ``WordWeights`` + mean
``Pooling`` compute it), so an unweighted mean is the special case w = 1.

Estimators (p(t) = count(t) / number of tokens counted, special tokens included, padding never):

* ``sif`` (Arora, Liang and Ma, ICLR 2017, "A simple but tough-to-beat baseline for sentence embeddings"):
  w(t) = a / (a + p(t)), with a = 1e-3 by default (``sif-3e-4`` sets another a). A token never counted gets 1.
* ``usif`` (Ethayarajh, RepL4NLP 2018, "Unsupervised random walk sentence embeddings"): the weighting part of
  uSIF, w(t) = a / (a/2 + p(t)), with a derived from the statistics instead of tuned: with v the number of
  distinct token ids counted and n the mean sentence length in tokens, threshold = 1 - (1 - 1/v)^n,
  alpha = |{t : p(t) > threshold}| / v, Z = v/2 and a = (1 - alpha) / (alpha Z). A token never counted takes the
  smallest probability counted, as in the paper's code. (uSIF's unit-normalising of word vectors and its
  common-component removal are not part of the weighting; a calibrator plays the second role here.)
* ``idf``: inverse document frequency with scikit-learn's smoothing (``TfidfTransformer(smooth_idf=True)``):
  w(t) = ln((1 + N) / (1 + df(t))) + 1, N sentences counted, df(t) the sentences containing t.
* ``none``: w = 1 (the plain mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from ..token_stats import TokenStatistics

#: SIF's default a (Arora et al. 2017 found 1e-4 to 1e-3 best; the issue's measurement used 1e-3).
SIF_A = 1e-3
WEIGHTING_NAMES = ("none", "sif", "usif", "idf")


@dataclass(frozen=True)
class Weighting:
    """A token weighting: ``name`` in :data:`WEIGHTING_NAMES`, and SIF's ``a`` (``None`` for the others)."""

    name: str = "none"
    a: float | None = None

    @classmethod
    def parse(cls, text: str) -> Weighting:
        """``"none"``, ``"sif"``, ``"sif-<a>"`` (e.g. ``"sif-3e-4"``), ``"usif"`` or ``"idf"``; an InputError for
        another name or a SIF ``a`` that is not a positive number."""
        text = text.strip().lower()
        name, _, param = text.partition("-")
        if name not in WEIGHTING_NAMES or (param and name != "sif"):
            raise InputError(f"unknown weighting {text!r}: use one of {', '.join(WEIGHTING_NAMES)} (or sif-<a>)")
        if name != "sif":
            return cls(name)
        try:
            a = float(param) if param else SIF_A
        except ValueError:
            a = float("nan")
        if not np.isfinite(a) or a <= 0:
            raise InputError(f"SIF's a must be a positive number, got {param!r} in {text!r}")
        return cls("sif", a)

    @property
    def weighted(self) -> bool:
        """Whether this weighting changes anything (everything but ``none``)."""
        return self.name != "none"

    @property
    def spec(self) -> str:
        """The text :meth:`parse` turns back into this weighting (``"sif"`` for the default a)."""
        if self.name == "sif" and self.a != SIF_A:
            return f"sif-{self.a:g}"
        return self.name

    def table(self, stats: TokenStatistics) -> np.ndarray:
        """The weight of every token id, float32 [V] (the module docstring gives each estimator); an InputError for
        empty statistics, or uSIF on statistics that cannot give its ``a``."""
        if self.name == "none":
            return np.ones(stats.vocab_size, dtype=np.float32)
        if self.name == "idf":
            if stats.n_sentences == 0:
                raise InputError("the token statistics are empty: count at least one sentence")
            n = float(stats.n_sentences)
            return (np.log((1.0 + n) / (1.0 + stats.document_frequency)) + 1.0).astype(np.float32)
        p = stats.probabilities()
        if self.name == "sif":
            assert self.a is not None
            return (self.a / (self.a + p)).astype(np.float32)
        a = usif_a(stats)
        seen = stats.counts > 0
        p = np.where(seen, p, p[seen].min())
        return (a / (0.5 * a + p)).astype(np.float32)


#: A plain (unweighted) average.
NO_WEIGHTING = Weighting("none")


def usif_a(stats: TokenStatistics) -> float:
    """uSIF's ``a`` derived from the statistics (Ethayarajh 2018; see the module docstring)."""
    p = stats.probabilities()
    seen = p[stats.counts > 0]
    v = float(seen.size)
    n = stats.n_tokens / max(stats.n_sentences, 1)  # mean sentence length in tokens
    threshold = 1.0 - (1.0 - 1.0 / v) ** n
    alpha = float((seen > threshold).sum()) / v
    if not 0.0 < alpha < 1.0:
        raise InputError(
            f"uSIF cannot derive its a from these token statistics ({int(alpha * v)} of {int(v)} distinct tokens "
            f"above its threshold {threshold:.3g}): count more text, or use the sif weighting"
        )
    return (1.0 - alpha) / (alpha * 0.5 * v)
