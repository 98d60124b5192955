"""Tokenising in worker processes (:class:`TokenizerPool`) and an encoder's way of tokenising its chunks
(:class:`ChunkTokenizer`).

Reading the Rust tokenizer's result out (one Python list per sentence) holds the GIL, which on a GPU host the
thread that launches the model needs: the pool's workers send back two plain arrays instead, and they use a
:class:`~.wordpiece.WordPieceShortcut` where it applies (``docs/performance.md``).
"""

from __future__ import annotations

import gc
import itertools
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from ..resources import usable_cpus
from .tokenization import TokenArrays, tokenize_arrays, truncating_copy
from .wordpiece import WordPieceShortcut

logger = logging.getLogger(__name__)

#: Fewest sentences one worker process is sent at a time: below that, the round trip costs more than it saves.
#: Small enough that the first chunk on CUDA (4,096 sentences, which the GPU waits for) is spread over 8 workers.
MIN_PART = 256


def _start_method() -> str:
    # fork starts a worker in milliseconds and runs nothing of the user's script again. Elsewhere (macOS,
    # Windows) spawn is the safe choice; it re-imports the main module, which then needs the usual
    # ``if __name__ == "__main__":`` guard.
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


#: Cores :func:`auto_processes` leaves to the encoding process itself: the main thread (launches), the feeder and
#: the two tokenisation threads (sending parts to the workers, sorting, laying batches out).
PARENT_CORES = 4
#: The most worker processes :func:`auto_processes` starts: 12 on a 16-core card host fed a graphed MiniLM-L6 faster
#: than 8 (docs/performance.md, thirteenth pass); more were not measured.
MAX_AUTO_PROCESSES = 12


def auto_processes(device_type: str, tokenizer: Any = None) -> int:
    """Worker processes used when none are asked for: on CUDA, this process's share of the usable CPU cores less
    :data:`PARENT_CORES` (at most :data:`MAX_AUTO_PROCESSES`; none below a share of 8 cores), provided the
    ``tokenizers.Tokenizer`` (if given) takes the :class:`WordPieceShortcut`; otherwise none. On CPU none, since
    there the model needs every core, and none where workers cannot be forked (off Linux). The share divides the
    cores among the ``LOCAL_WORLD_SIZE`` ranks that torchrun starts on one host. Without the shortcut, workers that
    run the Rust pipeline serially were slower than in-process tokenisation, hence the condition
    (docs/performance.md).
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
    return min(MAX_AUTO_PROCESSES, share - PARENT_CORES)


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
