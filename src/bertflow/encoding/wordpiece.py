"""An exact, faster tokenisation of plain ASCII sentences for BERT-style WordPiece tokenizers
(:class:`WordPieceShortcut`): the same ids as the ``tokenizers`` pipeline, several times cheaper per sentence, used by
the tokeniser worker processes (``docs/performance.md``)."""

from __future__ import annotations

import itertools
import json
import logging
import operator
import re
import string
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: Distinct words a :class:`WordPieceShortcut` remembers before it starts afresh (about 150 bytes each, so ~30 MB
#: per worker process at most; relearning a word costs one call of the WordPiece model, about 2 us).
MEMO_LIMIT = 200_000

#: One word of BERT pre-tokenisation on ASCII text: a run of letters and digits, or one punctuation character.
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[" + re.escape(string.punctuation) + "]")
#: ASCII control characters that BertNormalizer deletes (tab, newline and carriage return are whitespace).
_ASCII_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
#: Ends each sentence in the shortcut's joined text: a control character, so no sentence it handles contains it;
#: it is a "word" of its own, remembered as the id :data:`_END_ID`, which no vocabulary has.
_END = "\x00"
_END_ID = -1
#: :data:`_ASCII_WORD` or :data:`_END`.
_WORD_OR_END = re.compile(_ASCII_WORD.pattern + "|" + _END)
#: Sentences the shortcut checks itself against when it is built (words, punctuation, case, long words,
#: digits, truncation).
_PROBES = [
    "A man is playing a guitar.",
    "Don't stop-believing!! (He said) 3.14 ~ 42% of e-mails",
    "UNAFFABLE unaffable Unaffable xyzzyplughfoo",
    "tab\tnew\nline\r\nend  spaces",
    "word " * 80,
    "a" * 150 + " b" * 3,
    "[x] {y} <z> @home #tag $5 &co ^_^ `q` |p| \\ /",
]


class WordPieceShortcut:
    """Exact, faster tokenisation of plain ASCII sentences for BERT-style WordPiece tokenizers.

    It applies to a tokenizer made of a ``BertNormalizer`` (control characters deleted, optionally lowercased),
    the ``BertPreTokenizer`` (words split at whitespace and punctuation), a ``WordPiece`` model and a post-processor
    that puts special tokens around the sentence (``TemplateProcessing``, ``BertProcessing`` or
    ``RobertaProcessing``). On a sentence that is ASCII, has no control character other than tab, newline and
    carriage return, and contains no added token (``[MASK]``, ``<s>`` ...), that pipeline reduces to: lowercase,
    split with one regular expression, WordPiece each word on its own, truncate, add the special tokens. Each
    distinct word goes through the tokenizer's own model once and is remembered (up to :data:`MEMO_LIMIT` words;
    the vocabulary's whole words from the start). Built by :meth:`from_tokenizer` (``None`` for any other kind of
    tokenizer), which checks it against the tokenizer on probe sentences.
    """

    def __init__(
        self,
        model: Any,
        lowercase: bool,
        prefix: list[int],
        suffix: list[int],
        max_length: int | None,
        left: bool,
        added: list[str],
    ) -> None:
        self._model = model
        self._lowercase = lowercase
        self._prefix, self._suffix = prefix, suffix
        # Truncation keeps max_length tokens in all, special tokens included.
        self._keep = None if max_length is None else max_length - len(prefix) - len(suffix)
        self._left = left
        pattern = "|".join([_ASCII_CONTROL, *(re.escape(a) for a in added)])
        # Case-insensitive: an added token marked "normalized" is matched after lowercasing.
        self._unsafe = re.compile(pattern, re.IGNORECASE)
        # What arrays() scans a list for first: control characters, then the first letters of the added tokens in
        # either case (two character classes; ``None``: no added token). Where an added token starts with a
        # non-ASCII letter, whose case-insensitive matches are more than its two cases, every sentence gets
        # ``_unsafe`` instead (``_scan_each``).
        self._control = re.compile(_ASCII_CONTROL)
        firsts = {a[:1] for a in added if a}
        cases = sorted({*map(str.lower, firsts), *map(str.upper, firsts)})
        self._firsts = re.compile("[" + "".join(map(re.escape, cases)) + "]") if cases else None
        self._scan_each = not all(map(str.isascii, firsts))
        # word -> its id where it is one word piece, else -2 - k for the pieces self._pieces[k] (one int per word
        # lets a whole list of words be looked up into one array in a single C loop).
        self._memo: dict[str, int] = {}
        self._pieces: list[list[int]] = []
        self._seed: dict[str, int] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> WordPieceShortcut | None:
        """A shortcut for a ``tokenizers.Tokenizer`` (its current truncation included), or ``None`` where none
        applies or the probe sentences come out differently."""
        config = json.loads(tokenizer.to_str())
        normalizer, pre, model = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}, config["model"]
        if (
            normalizer.get("type") != "BertNormalizer"
            or not normalizer.get("clean_text", False)
            or pre.get("type") != "BertPreTokenizer"
            or model.get("type") != "WordPiece"
            or config.get("padding") is not None
        ):
            return None
        specials = _special_tokens(config.get("post_processor"))
        if specials is None:
            return None
        truncation = config.get("truncation")
        if truncation is not None and (
            truncation.get("stride", 0) != 0 or truncation["max_length"] <= len(specials[0]) + len(specials[1])
        ):
            return None
        shortcut = cls(
            tokenizer.model,
            bool(normalizer.get("lowercase", True)),
            specials[0],
            specials[1],
            None if truncation is None else int(truncation["max_length"]),
            truncation is not None and truncation.get("direction", "Right") == "Left",
            [a["content"] for a in config.get("added_tokens", [])],
        )
        shortcut._seed_memo(model)
        expected = [e.ids for e in tokenizer.encode_batch(_PROBES, add_special_tokens=True)]
        if shortcut.ids(_PROBES) != expected:
            logger.debug("the WordPiece shortcut disagrees with the tokenizer on its probes; not used")
            return None
        return shortcut

    def ids(self, sentences: Sequence[str]) -> list[list[int] | None]:
        """Token ids per sentence, special tokens included and truncated as the tokenizer would; ``None`` for
        each sentence the shortcut does not handle (give those to the tokenizer)."""
        handled, flat, offsets = self.arrays(sentences)
        parts = iter(np.split(flat, offsets[1:-1]))
        return [next(parts).tolist() if h else None for h in handled.tolist()]

    def arrays(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sentences the shortcut handles, tokenised together: ``(handled, ids, offsets)``, ``handled`` bool [n]
        (the others go to the tokenizer), then the handled sentences' ids in order, as :class:`TokenArrays` has them
        (int32 [total], int64 [handled + 1]; special tokens included, truncated as the tokenizer would)."""
        # Scans of the whole list first (``isascii`` is a flag lookup). Without a control character anywhere, only a
        # sentence holding the first letter of an added token (either case) can hold one, found from where those
        # letters are in the joined list; on most lists there are none. The full scan runs on those sentences only.
        joined = "\n".join(sentences)
        handled = np.fromiter(map(str.isascii, sentences), dtype=bool, count=len(sentences))
        if self._scan_each or self._control.search(joined):
            suspects: Iterable[int] = range(len(sentences))
        elif self._firsts is not None:
            ends = np.cumsum(np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences)) + 1)
            where = [m.start() for m in self._firsts.finditer(joined)]
            suspects = np.unique(np.searchsorted(ends, where, side="right")).tolist()
        else:
            suspects = ()
        for i in suspects:
            if handled[i] and self._unsafe.search(sentences[i]) is not None:
                handled[i] = False
        chosen = list(itertools.compress(sentences, handled.tolist()))
        if not chosen:
            return handled, np.empty(0, np.int32), np.zeros(1, np.int64)
        # The whole list in a few C loops (one regular expression, one look-up per word, one read-out) instead of
        # a few Python calls per sentence: about half the time on STS sentences.
        text = _END.join(chosen) + _END
        words = _WORD_OR_END.findall(text.lower() if self._lowercase else text)
        # One itemgetter call looks every word up (a tuple; a bare value for one word): ~40% faster than a map.
        look_up = operator.itemgetter(*words, _END)  # _END: never a single word
        try:
            codes = np.fromiter(look_up(self._memo), dtype=np.int64, count=len(words) + 1)[:-1]
        except KeyError:
            self._learn(words)
            codes = np.fromiter(look_up(self._memo), dtype=np.int64, count=len(words) + 1)[:-1]
        flat = self._expand(codes)
        ends = np.flatnonzero(flat == _END_ID)
        starts = np.concatenate([np.zeros(1, np.int64), ends[:-1] + 1])
        found = ends - starts  # each sentence's word-piece ids, before truncation
        kept = found if self._keep is None else np.minimum(found, self._keep)
        first = starts + (found - kept if self._left else 0)  # where the kept ids start in ``flat``
        head, tail = len(self._prefix), len(self._suffix)
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(kept + head + tail)])
        ids = np.empty(int(offsets[-1]), dtype=np.int32)
        sentence = np.repeat(np.arange(len(kept)), kept)
        rank = _ranks(kept)  # each kept id's position among its sentence's
        ids[offsets[:-1][sentence] + head + rank] = flat[first[sentence] + rank]
        for j, token in enumerate(self._prefix):
            ids[offsets[:-1] + j] = token
        for j, token in enumerate(self._suffix):
            ids[offsets[1:] - tail + j] = token
        return handled, ids, offsets

    def _expand(self, codes: np.ndarray) -> np.ndarray:
        """The word-piece ids of words given as memo codes (int64 [words] -> [pieces]; :data:`_END_ID` kept)."""
        split = np.flatnonzero(codes < _END_ID)  # words of several pieces (a few percent of English words)
        if not len(split):
            return codes
        pieces = [self._pieces[-2 - c] for c in codes[split].tolist()]
        sizes = np.ones(len(codes), dtype=np.int64)
        sizes[split] = [len(p) for p in pieces]
        flat = np.repeat(codes, sizes)
        at = (np.cumsum(sizes) - sizes)[split]  # where each such word's pieces start
        flat[np.repeat(at, sizes[split]) + _ranks(sizes[split])] = list(itertools.chain.from_iterable(pieces))
        return flat

    def _seed_memo(self, model: dict[str, Any]) -> None:
        """Remember every whole word of the vocabulary (``model``: the WordPiece model's JSON) as its own id: exact,
        since WordPiece takes a word's longest prefix in the vocabulary (up to ``max_input_chars_per_word``), and the
        model is then called only for words outside it."""
        prefix = model.get("continuing_subword_prefix") or "##"
        longest = int(model.get("max_input_chars_per_word", 100))
        self._seed = {
            w: int(i) for w, i in model.get("vocab", {}).items() if 0 < len(w) <= longest and not w.startswith(prefix)
        }
        self._restart_memo()

    def _restart_memo(self) -> None:
        self._memo.clear()
        self._memo.update(self._seed)
        self._memo[_END] = _END_ID
        self._pieces.clear()

    def _learn(self, words: list[str]) -> None:
        """Remember each of ``words`` not known yet (first starting afresh when over :data:`MEMO_LIMIT`)."""
        if len(self._memo) > MEMO_LIMIT + len(self._seed):
            self._restart_memo()
        for w in set(words).difference(self._memo):
            ids = [t.id for t in self._model.tokenize(w)]
            if len(ids) == 1:
                self._memo[w] = ids[0]
            else:
                self._memo[w] = -2 - len(self._pieces)
                self._pieces.append(ids)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """``[0 .. c - 1 for c in counts]`` concatenated (int64): each item's position within its group."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _special_tokens(post: dict[str, Any] | None) -> tuple[list[int], list[int]] | None:
    """Ids the post-processor puts before and after a single sentence, or ``None`` for another kind."""
    if post is None:
        return [], []
    if post.get("type") in ("BertProcessing", "RobertaProcessing"):
        return [int(post["cls"][1])], [int(post["sep"][1])]
    if post.get("type") != "TemplateProcessing":
        return None
    before: list[int] = []
    after: list[int] = []
    seen_sequence = False
    for piece in post["single"]:
        if "Sequence" in piece:
            if seen_sequence:
                return None
            seen_sequence = True
        else:
            ids = [int(i) for i in post["special_tokens"][piece["SpecialToken"]["id"]]["ids"]]
            (after if seen_sequence else before).extend(ids)
    return (before, after) if seen_sequence else None
