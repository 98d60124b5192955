"""Tokenisation into flat numpy arrays (:class:`TokenArrays`), on the calling thread or in worker processes.

Reading the Rust tokenizer's result out (one Python list per sentence) holds the GIL, which on a GPU host the
thread that launches the model needs: a :class:`TokenizerPool` moves it into worker processes that send back two
plain arrays, and they use a :class:`WordPieceShortcut`, the same ids on plain ASCII text several times faster
for BERT-style WordPiece tokenizers (``docs/performance.md``).
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import multiprocessing
import operator
import os
import queue
import re
import signal
import string
import sys
import threading
import warnings
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from ..resources import CountedSetting, usable_cpus

logger = logging.getLogger(__name__)

#: Fewest sentences one worker process is sent at a time: below that, the round trip costs more than it saves.
#: Small enough that the first chunk on CUDA (4,096 sentences, which the GPU waits for) is spread over 8 workers.
MIN_PART = 256
#: Distinct words a :class:`WordPieceShortcut` remembers before it starts afresh (about 150 bytes each, so ~30 MB
#: per worker process at most; relearning a word costs one call of the WordPiece model, about 2 us).
MEMO_LIMIT = 200_000


@dataclass
class TokenArrays:
    """Token ids of a list of sentences: ``ids`` [total] int32, all sentences back to back; ``offsets`` [n+1]
    int64, sentence ``i`` is ``ids[offsets[i]:offsets[i+1]]`` (special tokens included, after truncation)."""

    ids: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """[n] token counts."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        """Number of sentences n."""
        return len(self.offsets) - 1

    def slice(self, start: int, stop: int) -> TokenArrays:
        """The token arrays of sentences ``start .. stop-1`` (a view of the ids; offsets rebased to 0)."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return TokenArrays(self.ids[lo:hi], self.offsets[start : stop + 1] - lo)

    @classmethod
    def concatenate(cls, parts: Sequence[TokenArrays]) -> TokenArrays:
        """The token arrays of consecutive lists of sentences, joined in order."""
        if len(parts) == 1:
            return parts[0]
        lengths = np.concatenate([p.lengths for p in parts])
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
        return cls(np.concatenate([p.ids for p in parts]), offsets)


#: Python's cyclic garbage collector (enabled or not), paused while any thread tokenises.
GC_ENABLED = CountedSetting(gc.isenabled, lambda on: gc.enable() if on else gc.disable())


def tokenize_arrays(tokenizer: Any, sentences: Sequence[str], shortcut: WordPieceShortcut | None = None) -> TokenArrays:
    """Token ids of ``sentences`` from a ``tokenizers.Tokenizer`` (set up to truncate, not pad) as flat arrays; the
    sentences a ``shortcut`` (built from the same tokenizer) handles skip the tokenizer, with the same ids."""
    items = list(sentences)
    # One Python list per sentence (or per word, in the shortcut): tens of thousands of allocations, which set off
    # the cyclic garbage collector, whose full passes over a large heap took up to 5x as long as the read-out itself
    # (measured on the GPU host). Lists of ints and strings cannot form cycles, so collection is paused here.
    with GC_ENABLED.held(False):
        if shortcut is not None:
            handled, flat, offsets = shortcut.arrays(items)
            rest = np.flatnonzero(~handled)
            if not len(rest):
                return TokenArrays(flat, offsets)
        # encode_batch_fast skips character offsets, which are never used (about 25% less tokenisation time).
        encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        chosen = [items[i] for i in rest] if shortcut is not None else items
        others = [e.ids for e in encode(chosen, add_special_tokens=True)]
    if shortcut is None:
        lengths = np.fromiter(map(len, others), dtype=np.int64, count=len(others))
        ids = np.fromiter(itertools.chain.from_iterable(others), dtype=np.int32, count=int(lengths.sum()))
        return TokenArrays(ids, np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)]))
    # Merge: the shortcut's sentences by one scatter, the tokenizer's (few: non-ASCII, added tokens) one by one.
    lengths = np.zeros(len(items), np.int64)
    lengths[handled] = np.diff(offsets)
    lengths[rest] = [len(ids) for ids in others]
    merged = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
    out = np.empty(int(merged[-1]), dtype=np.int32)
    shift = merged[:-1][handled] - offsets[:-1]
    out[np.repeat(shift, np.diff(offsets)) + np.arange(len(flat))] = flat
    for i, ids in zip(rest.tolist(), others, strict=True):
        out[merged[i] : merged[i + 1]] = ids
    return TokenArrays(out, merged)


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


def _start_method() -> str:
    # fork starts a worker in milliseconds and runs nothing of the user's script again. Elsewhere (macOS,
    # Windows) spawn is the safe choice; it re-imports the main module, which then needs the usual
    # ``if __name__ == "__main__":`` guard.
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def auto_processes(device_type: str, tokenizer: Any = None) -> int:
    """Worker processes used when none are asked for: on CUDA, half of this process's share of the usable CPU
    cores (at most 8; none below 8 cores), provided the ``tokenizers.Tokenizer`` (if given) takes the
    :class:`WordPieceShortcut`; otherwise none. On CPU none, since there the model needs every core, and none
    where workers cannot be forked (off Linux). The share divides the cores among the ``LOCAL_WORLD_SIZE`` ranks
    that torchrun starts on one host. Without the shortcut, workers that run the Rust pipeline serially were
    slower than in-process tokenisation, hence the condition (docs/performance.md).
    """
    if device_type != "cuda" or _start_method() != "fork":
        # Spawned workers would re-run the caller's main module: not something to start unasked.
        return 0
    cores = usable_cpus()
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    share = cores // ranks
    if share < 8 or (tokenizer is not None and WordPieceShortcut.from_tokenizer(tokenizer) is None):
        return 0
    return min(8, share // 2)


_WORKER_TOKENIZER: Any = None
_WORKER_SHORTCUT: WordPieceShortcut | None = None


def _init_worker(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER, _WORKER_SHORTCUT
    # A forked worker inherits the parent's Rust thread pool as memory only, without its threads: using it
    # would hang. Each worker tokenises serially; the pool's processes are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # The worker collects its own garbage but never walks the heap it inherited (gc.freeze): a collection writes
    # to each object's header, so the parent's memory would be copied page by page (docs/performance.md).
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent to handle, then it stops us
    from tokenizers import Tokenizer

    _WORKER_TOKENIZER = Tokenizer.from_str(tokenizer_json)
    _WORKER_SHORTCUT = WordPieceShortcut.from_tokenizer(_WORKER_TOKENIZER)


def _worker_tokenize(sentences: list[str]) -> TokenArrays:
    return tokenize_arrays(_WORKER_TOKENIZER, sentences, _WORKER_SHORTCUT)


def _worker_main(conn: Connection, tokenizer_json: str, inherited: list[Connection]) -> None:
    """A worker's life: answer each list of sentences received on ``conn`` with its :class:`TokenArrays` (or the
    exception raised), until the pool closes its end or dies."""
    for other in inherited:
        # Under fork this process holds copies of the pool's ends of every pipe made so far, its own included;
        # closed, so that each worker sees its pipe end (EOF) when the pool closes it or its process dies.
        other.close()
    _init_worker(tokenizer_json)
    conn.send(os.getpid())  # ready
    while True:
        try:
            sentences = conn.recv()
        except EOFError:
            return
        try:
            reply: TokenArrays | BaseException = _worker_tokenize(sentences)
        except Exception as e:  # noqa: BLE001 - sent to the caller, which raises it
            reply = e
        try:
            conn.send(reply)
        except OSError:  # the pool was closed while this list was being tokenised: nobody waits for it
            return


def _stop_workers(conns: list[Connection], procs: list[BaseProcess], idle: queue.SimpleQueue[int | None]) -> None:
    for _ in procs:
        idle.put(None)  # wakes any thread waiting for a worker: it finds the pool closed
    for conn in conns:
        conn.close()  # the worker reads EOF and returns
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join()


class TokenizerPool:
    """``processes`` worker processes that tokenise lists of sentences into :class:`TokenArrays`, each with the
    ``tokenizers.Tokenizer`` rebuilt from ``tokenizer_json`` (its ``to_str()``, truncation settings included).

    A list is cut into up to ``processes`` consecutive parts of at least :data:`MIN_PART` sentences, tokenised at
    the same time; the result does not depend on ``processes``. Each worker has a pipe of its own, written and read
    by the calling thread (a ``ProcessPoolExecutor`` passes every part through two more threads of this process,
    which wait for the GIL, and a queue that the workers read in turn: docs/performance.md). Several threads may
    call :meth:`tokenize` at once. :meth:`close`, garbage collection of the pool or the interpreter's exit stop the
    workers.
    """

    def __init__(self, tokenizer_json: str, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"a tokenizer pool needs at least one process, got {processes}")
        self.processes = int(processes)
        context = multiprocessing.get_context(_start_method())
        fork = context.get_start_method() == "fork"
        conns: list[Connection] = []
        procs: list[BaseProcess] = []
        # Started now, from this thread and before the encoder's own threads exist. Python 3.12+ warns about fork
        # in any process with threads; the workers use nothing of the parent's threads (see _init_worker).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
            for k in range(self.processes):
                ours, theirs = context.Pipe()
                inherited = [*conns, ours] if fork else []  # spawn passes a child only what it is given
                proc = context.Process(
                    target=_worker_main, args=(theirs, tokenizer_json, inherited), name=f"bertflow-tokenize-{k}"
                )
                proc.daemon = True
                proc.start()
                theirs.close()
                conns.append(ours)
                procs.append(proc)
        self._conns = conns
        self._idle: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._dispatch = threading.Lock()
        self._closed = False
        # Runs once: at close(), when the pool is garbage-collected, or at interpreter exit.
        self._stop = weakref.finalize(self, _stop_workers, conns, procs, self._idle)
        try:
            #: Process ids of the workers, each ready (its tokenizer built) by now.
            self.pids = sorted(conn.recv() for conn in conns)
        except EOFError:
            self.close()
            raise BrokenProcessPool("a tokenisation worker process died while starting") from None
        for k in range(self.processes):
            self._idle.put(k)
        logger.debug("tokenizer pool: %d worker processes %s", self.processes, self.pids)

    def tokenize(self, sentences: Sequence[str]) -> TokenArrays:
        """Token arrays of ``sentences`` (as :func:`tokenize_arrays` would return them); ``BrokenProcessPool`` when a
        worker died (the pool is then closed: the caller tokenises on its own), RuntimeError once closed."""
        if self._closed:
            raise RuntimeError("the tokenizer pool is closed")
        n = len(sentences)
        parts = max(1, min(self.processes, n // MIN_PART))
        bounds = np.linspace(0, n, parts + 1).astype(np.int64).tolist()
        taken: list[int] = []
        replies: list[TokenArrays | BaseException] = []
        try:
            # One caller takes its workers at a time: two that each held some while waiting for more would wait
            # for each other for ever. Workers come back as soon as their reply is read.
            with self._dispatch:
                for a, b in itertools.pairwise(bounds):
                    k = self._idle.get()
                    if k is None:
                        raise RuntimeError("the tokenizer pool is closed")
                    taken.append(k)
                    self._conns[k].send(list(sentences[a:b]))
            for k in taken:
                replies.append(self._conns[k].recv())
                self._idle.put(k)
        except (EOFError, OSError) as e:
            self.close()
            raise BrokenProcessPool("a tokenisation worker process died") from e
        except BaseException:
            # A worker may still owe a reply (Ctrl-C between send and receive, say), which the next call would
            # read as its own: the pool is closed rather than trusted.
            self.close()
            raise
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return TokenArrays.concatenate(replies)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the worker processes; safe to call twice, and from another thread (its call then fails)."""
        self._closed = True
        self._stop()

    @property
    def closed(self) -> bool:
        """Whether the pool was closed (by :meth:`close`, or after a worker died)."""
        return self._closed


def truncating_copy(tokenizer: Any, max_length: int) -> Any:
    """A copy of a Hugging Face fast ``tokenizer``'s Rust tokenizer that truncates to ``max_length`` tokens (special
    tokens included, on its ``truncation_side``) and never pads (a copy: those settings are state on the object)."""
    from tokenizers import Tokenizer

    rust = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    rust.no_padding()
    rust.enable_truncation(max_length, direction=getattr(tokenizer, "truncation_side", "right"))
    return rust


class ChunkTokenizer:
    """How an encoder tokenises its chunks: with :attr:`rust` (:func:`truncating_copy` of ``tokenizer``), in the
    worker processes of :attr:`pool` while they run (:attr:`auto_processes`: how many ``tokenize_processes=None``
    means on ``device_type``). A worker that dies (killed for memory, say) loses nothing: that chunk and all later
    ones are tokenised in this process, with a warning."""

    def __init__(self, tokenizer: Any, max_length: int, device_type: str) -> None:
        self.rust = truncating_copy(tokenizer, max_length)
        self.auto_processes = auto_processes(device_type, self.rust)
        self.pool: TokenizerPool | None = None
        self._broken = False

    def processes(self, requested: int | None) -> int:
        """Worker processes to run when ``requested`` (``None``: :attr:`auto_processes`); 0 once a worker died."""
        if self._broken:
            return 0
        return self.auto_processes if requested is None else requested

    def start(self, processes: int) -> TokenizerPool | None:
        """Start (or resize, or stop) the worker processes to match ``processes``; returns them (``None``: none run)."""
        if self.pool is not None and (self.pool.closed or self.pool.processes != processes):
            self.close()
        if processes > 0 and self.pool is None:
            self.pool = TokenizerPool(self.rust.to_str(), processes)
        return self.pool

    def tokenize(self, sentences: Sequence[str], pooled: bool = True) -> TokenArrays:
        """Token ids of ``sentences``: in the worker processes when there are any and ``pooled``, else on the
        calling thread."""
        pool = self.pool
        if pooled and pool is not None and not pool.closed:
            try:
                return pool.tokenize(sentences)
            except BrokenProcessPool:
                logger.warning("a tokenisation worker process died; tokenising in this process from now on")
                self._broken = True
                self.close()
        return tokenize_arrays(self.rust, sentences)

    def close(self) -> None:
        """Stop the worker processes, if any (:meth:`start` starts them again)."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()


# The Rust tokenizer's own thread pool does the parallel work; keep it on (and quiet the fork warning in CLI
# subprocesses, which never tokenise before forking).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
