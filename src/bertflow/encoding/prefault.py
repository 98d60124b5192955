"""Writing a fresh result array's pages on a thread, ahead of the chunks copied into it (what
``EncodeSettings.prefault`` turns on: for :meth:`SentenceEncoder.encode`'s result, :class:`ResultRows`, and on CUDA
for each fresh chunk array of the chunk stream, ``stream.py``).

Why: a fresh array's pages are faulted in by whoever writes them first. Without this, that is the main thread, in
each chunk's copy from the device, while it also launches the next chunk's kernels: 10-16 ms (MiniLM-L6) and 32-37 ms
(BERT-base) of system time per 40,000 sentences on an H100 host (docs/performance.md, fifteenth pass). numpy's
``fill`` releases the GIL, so a thread can take those faults instead. It writes block after block and stays a bounded
distance ahead of the rows asked for, so a large result neither holds up the first chunk until all of it is written
nor takes all its memory at once.
"""

from __future__ import annotations

import threading

import numpy as np

#: Bytes the thread writes between two looks at how far the chunks have come.
BLOCK_BYTES = 16 << 20
#: Bytes the thread may write beyond the last row asked for (over two of the largest BERT-base chunks, 201 MB each).
AHEAD_BYTES = 512 << 20


class PageWriter:
    """Writes ``out``'s rows (any 2-D array) on a thread, in order, block by block, at most ``ahead_bytes`` beyond the
    last row :meth:`wait` asked for. The caller fills ``out`` in row order: :meth:`wait` before writing each part,
    :meth:`close` when done or failed (stops the thread; rows not reached stay as ``np.empty`` left them)."""

    def __init__(self, out: np.ndarray, *, block_bytes: int = BLOCK_BYTES, ahead_bytes: int = AHEAD_BYTES) -> None:
        row_bytes = max(1, out.itemsize * out.shape[1])
        self._out = out
        self._step = max(1, block_bytes // row_bytes)
        self._ahead = max(self._step, ahead_bytes // row_bytes)
        self._written = 0  # rows written by the thread so far
        self._asked = 0  # rows the caller has waited for so far
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="bertflow-prefault", daemon=True)
        self._thread.start()

    @property
    def array(self) -> np.ndarray:
        """The array being written."""
        return self._out

    @property
    def written(self) -> int:
        """Rows written by the thread so far."""
        return self._written

    def _run(self) -> None:
        rows = len(self._out)
        start = 0
        try:
            while start < rows:
                with self._cond:
                    while not self._stop and start >= self._asked + self._ahead:
                        self._cond.wait()
                    if self._stop:
                        break
                end = min(rows, start + self._step)
                self._out[start:end].fill(0)  # releases the GIL while it faults the pages in
                with self._cond:
                    self._written = start = end
                    self._cond.notify_all()
        finally:  # finished, stopped or failed: nobody waits on this thread any more
            with self._cond:
                self._stop = True
                self._cond.notify_all()

    def wait(self, rows: int) -> None:
        """Return once the first ``rows`` rows are written (at once after :meth:`close`)."""
        with self._cond:
            self._asked = max(self._asked, rows)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._stop or self._written >= rows)

    def close(self) -> None:
        """Stop the thread and wait for it (idempotent)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()


class ResultRows:
    """The float32 [n, width] array that an encode's chunks are copied into, row block by row block (what
    :meth:`SentenceEncoder.encode` passes as the chunk stream's ``into``).

    With a ``guess`` of the width, the array is made at once and a :class:`PageWriter` writes its pages ahead of the
    chunks; if the first chunk has another width (a transform that changed it), that array is dropped and the right
    one made and written ahead instead. Without a guess, the array is made at the first chunk, its pages faulted in
    by the copies. :meth:`close` when done or failed.
    """

    def __init__(self, n: int, guess: int | None) -> None:
        self._n = n
        self._out: np.ndarray | None = None
        self._pages: PageWriter | None = None
        if guess is not None:
            self._start(guess)

    def _start(self, width: int) -> None:
        self._out = np.empty((self._n, width), dtype=np.float32)
        self._pages = PageWriter(self._out)

    def rows(self, row: int, rows: int, width: int) -> np.ndarray:
        """The writable rows ``row : row + rows`` of the result, whose width is ``width``."""
        if self._out is not None and self._out.shape[1] != width:  # the guessed width was wrong
            self.close()
            self._out = None  # freed before the right one is made
            self._start(width)
        if self._out is None:
            self._out = np.empty((self._n, width), dtype=np.float32)
        if self._pages is not None:
            self._pages.wait(row + rows)
        return self._out[row : row + rows]

    @property
    def array(self) -> np.ndarray:
        """The whole result (after the last chunk)."""
        if self._out is None:
            raise RuntimeError("no chunk was copied into the result")
        return self._out

    def close(self) -> None:
        """Stop the page writer, if any (idempotent)."""
        if self._pages is not None:
            self._pages.close()
