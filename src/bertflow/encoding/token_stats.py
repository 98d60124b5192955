"""Token statistics: how often each token id occurs in an unlabeled corpus, the data of frequency-weighted pooling
(:mod:`bertflow.encoding.pooling.weighting`). Tokens are counted as the encoder feeds them to the model: truncated,
special tokens included, padding never. Saved in a model folder as :data:`STATS_CONFIG` (the scalars) and
:data:`STATS_ARRAYS` (the two count vectors), both in its checksums.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, ModelFileError
from ..io.formats import FORMAT_VERSION, check_format, load_arrays, read_json, save_arrays, write_json
from .tokenization import TokenArrays

STATS_CONFIG = "token_statistics.json"
STATS_ARRAYS = "token_statistics.safetensors"


class TokenStatistics:
    """Unigram counts of token ids over a corpus (no labels): ``counts`` int64 [V] occurrences of each id,
    ``document_frequency`` int64 [V] sentences containing it, out of ``n_sentences``. The arrays are copied and
    made read-only: the object never changes once built (combine two with ``+``), so its :meth:`digest` holds."""

    def __init__(self, counts: np.ndarray, document_frequency: np.ndarray, n_sentences: int) -> None:
        counts = np.array(counts, dtype=np.int64)
        document_frequency = np.array(document_frequency, dtype=np.int64)
        if counts.ndim != 1 or counts.shape != document_frequency.shape:
            raise InputError(
                f"token counts and document frequencies must be two vectors of one length, got shapes "
                f"{counts.shape} and {document_frequency.shape}"
            )
        if (counts < 0).any() or (document_frequency < 0).any() or (document_frequency > counts).any():
            raise InputError("token counts must be non-negative, with each document frequency at most its count")
        if int(n_sentences) < 0 or (document_frequency > int(n_sentences)).any():
            raise InputError(f"{n_sentences} sentences cannot give the document frequencies given")
        counts.flags.writeable = False
        document_frequency.flags.writeable = False
        self.counts = counts
        self.document_frequency = document_frequency
        self.n_sentences = int(n_sentences)
        self._digest: str | None = None

    @classmethod
    def from_tokens(cls, tokens: TokenArrays, vocab_size: int) -> TokenStatistics:
        """Count the token ids of tokenised sentences; an InputError for an id outside ``[0, vocab_size)``."""
        ids = np.asarray(tokens.ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise InputError(f"token id {int(ids.max())} is outside the vocabulary of {vocab_size} tokens")
        counts = np.bincount(ids, minlength=vocab_size)
        # Document frequency: each (sentence, id) pair once. Sentence number * V + id is unique per pair.
        sentence = np.repeat(np.arange(len(tokens.lengths), dtype=np.int64), tokens.lengths)
        pairs = np.unique(sentence * vocab_size + ids)
        df = np.bincount(pairs % vocab_size, minlength=vocab_size)
        return cls(counts, df, len(tokens.lengths))

    @classmethod
    def empty(cls, vocab_size: int) -> TokenStatistics:
        """No sentences counted yet (the start of a sum over chunks)."""
        zeros = np.zeros(vocab_size, dtype=np.int64)
        return cls(zeros, zeros, 0)

    @classmethod
    def total(cls, parts: Iterable[TokenStatistics]) -> TokenStatistics:
        """The statistics of the union of the corpora ``parts`` were counted on (at least one)."""
        parts = list(parts)
        if not parts:
            raise InputError("no token statistics to add up")
        return functools.reduce(operator.add, parts)

    def __add__(self, other: TokenStatistics) -> TokenStatistics:
        """Counts of both corpora together (same vocabulary)."""
        if not isinstance(other, TokenStatistics):
            return NotImplemented
        if other.vocab_size != self.vocab_size:
            raise InputError(
                f"cannot add token statistics over {self.vocab_size} and {other.vocab_size} token ids: "
                "count both corpora with the same tokenizer"
            )
        return TokenStatistics(
            self.counts + other.counts,
            self.document_frequency + other.document_frequency,
            self.n_sentences + other.n_sentences,
        )

    @property
    def vocab_size(self) -> int:
        """V, the number of token ids covered."""
        return int(self.counts.shape[0])

    @property
    def n_tokens(self) -> int:
        """Tokens counted in all (the sum of :attr:`counts`)."""
        return int(self.counts.sum())

    def probabilities(self) -> np.ndarray:
        """float64 [V]: unigram probability p(t) = count(t) / n_tokens (0 for ids never seen); an InputError when
        nothing was counted."""
        if self.n_tokens == 0:
            raise InputError("the token statistics are empty: count at least one sentence")
        return self.counts / float(self.n_tokens)

    def digest(self) -> str:
        """16 hex digits of a sha256 over the counts, document frequencies and sentence count: equal digests, equal
        statistics (recorded in the encoder's config, so a model knows which statistics weighted its vectors)."""
        if self._digest is None:
            h = hashlib.sha256(f"n_sentences={self.n_sentences};V={self.vocab_size};".encode())
            h.update(self.counts.astype("<i8").tobytes())
            h.update(self.document_frequency.astype("<i8").tobytes())
            self._digest = h.hexdigest()[:16]
        return self._digest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenStatistics):
            return NotImplemented
        return (
            self.n_sentences == other.n_sentences
            and np.array_equal(self.counts, other.counts)
            and np.array_equal(self.document_frequency, other.document_frequency)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value object: compared, never hashed

    def __getstate__(self) -> dict[str, Any]:  # pickled to worker processes (encode_multi_device)
        return {"counts": self.counts, "document_frequency": self.document_frequency, "n_sentences": self.n_sentences}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["counts"], state["document_frequency"], state["n_sentences"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"TokenStatistics(vocab_size={self.vocab_size}, n_sentences={self.n_sentences}, "
            f"n_tokens={self.n_tokens}, digest={self.digest()!r})"
        )

    def save(self, folder: str | Path) -> None:
        """Write :data:`STATS_CONFIG` (scalars, format version) and :data:`STATS_ARRAYS` (the count vectors) into
        ``folder`` (created if needed)."""
        from .._version import __version__

        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        save_arrays(path / STATS_ARRAYS, {"counts": self.counts, "document_frequency": self.document_frequency})
        write_json(
            path / STATS_CONFIG,
            {
                "format_version": FORMAT_VERSION,
                "bertflow_version": __version__,
                "vocab_size": self.vocab_size,
                "n_sentences": self.n_sentences,
                "n_tokens": self.n_tokens,
                "digest": self.digest(),
            },
        )

    @classmethod
    def load(cls, folder: str | Path) -> TokenStatistics:
        """Read what :meth:`save` wrote, bit for bit; a ModelFileError for a missing, corrupted or edited file (the
        recorded digest must match the arrays)."""
        path = Path(folder)
        config = read_json(path / STATS_CONFIG)
        check_format(config, path / STATS_CONFIG, kind="token statistics")
        arrays = load_arrays(path / STATS_ARRAYS)
        try:
            stats = cls(arrays["counts"], arrays["document_frequency"], int(config["n_sentences"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFileError(f"{path} holds garbled token statistics ({e}); was it edited?") from None
        if stats.digest() != config.get("digest"):
            raise ModelFileError(f"{path / STATS_CONFIG} does not describe {path / STATS_ARRAYS}; was it edited?")
        return stats
