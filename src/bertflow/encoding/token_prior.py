"""Generic token statistics shipped with bertflow: the frequency prior of ``--calibrator auto``'s SIF weighting.

Counted on the fitting sentences alone, SIF's p(t) is *topical*: a narrow set's own subject words get weighted down
with "the" and "of". On the 26 STS sets fitted one by one (docs/beyond.md), SIF from the set's own counts put 18 of
71 set x size cells more than 2 points below the raw encoder, SIF from a generic corpus 3. So ``auto`` weights with
WordPiece counts of 100,000 public-domain English sentences (``sentences-100k.txt.gz`` of the project's data
folder, rebuilt by ``python benchmarks/build_token_prior.py``), for an encoder whose tokenizer has exactly that
vocabulary (:func:`prior_for` returns ``None`` otherwise, and ``auto`` then does not weight).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from .token_stats import TokenStatistics

#: Where the shipped priors live (one folder each: ``prior.json`` + the :class:`TokenStatistics` files).
PRIORS_DIR = Path(__file__).with_name("priors")
PRIOR_CONFIG = "prior.json"


def vocab_digest(tokenizer: Any) -> str:
    """16 hex digits of a sha256 over a tokenizer's vocabulary in id order (token strings joined by newlines)."""
    vocab = tokenizer.get_vocab()
    ordered = sorted(vocab.items(), key=lambda item: item[1])
    return hashlib.sha256("\n".join(token for token, _ in ordered).encode("utf-8")).hexdigest()[:16]


class TokenPrior:
    """A shipped generic :class:`TokenStatistics` (``statistics``) and what it was counted on: ``name`` (its
    folder, e.g. ``"gutenberg-100k-wordpiece-uncased"``), ``vocab_digest`` (:func:`vocab_digest` of the tokenizer)
    and ``source`` (the corpus in words, for the model card)."""

    def __init__(self, folder: Path) -> None:
        meta = json.loads((folder / PRIOR_CONFIG).read_text(encoding="utf-8"))
        self.name = folder.name
        self.vocab_digest = str(meta["vocab_digest"])
        self.source = str(meta["source"])
        self.statistics = TokenStatistics.load(folder)

    def __repr__(self) -> str:
        return f"TokenPrior({self.name!r}, {self.statistics!r})"


@cache
def available_priors() -> tuple[TokenPrior, ...]:
    """Every prior shipped in :data:`PRIORS_DIR` (read once per process)."""
    if not PRIORS_DIR.is_dir():
        return ()
    return tuple(TokenPrior(f) for f in sorted(PRIORS_DIR.iterdir()) if (f / PRIOR_CONFIG).is_file())


def prior_for(tokenizer: Any) -> TokenPrior | None:
    """The shipped prior counted with exactly ``tokenizer``'s vocabulary, or ``None``."""
    digest = vocab_digest(tokenizer)
    return next((p for p in available_priors() if p.vocab_digest == digest), None)
