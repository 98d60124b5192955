"""bertflow.encoding.prefault: PageWriter (a result's rows written on a thread, in order, a bounded distance ahead of
the rows asked for, and stopped by close()) and ResultRows (the encode result it writes, at a guessed width)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from bertflow.encoding.prefault import PageWriter, ResultRows


def _writing() -> bool:
    return any(t.name == "bertflow-prefault" for t in threading.enumerate())


def _rows(n: int, width: int = 8) -> np.ndarray:
    return np.full((n, width), np.nan, dtype=np.float32)  # NaN: not written yet


def test_wait_returns_once_the_rows_asked_for_are_written():
    out = _rows(1000)
    pages = PageWriter(out, block_bytes=out[0].nbytes * 7, ahead_bytes=out[0].nbytes * 20)
    for end in (1, 50, 51, 400, 1000):
        pages.wait(end)
        assert pages.written >= end and not np.isnan(out[:end]).any()
    pages.close()
    assert (out == 0).all() and not _writing()


def test_the_thread_stays_a_bounded_distance_ahead():
    out = _rows(500)
    row = out[0].nbytes
    pages = PageWriter(out, block_bytes=2 * row, ahead_bytes=4 * row)
    pages.wait(3)
    time.sleep(0.3)  # time enough to write all 500 rows if nothing held the thread back
    assert 3 <= pages.written <= 3 + 4 + 2 and np.isnan(out[3 + 4 + 2 :]).all()
    pages.wait(100)
    time.sleep(0.3)
    assert 100 <= pages.written <= 100 + 4 + 2 and np.isnan(out[100 + 4 + 2 :]).all()
    pages.close()


def test_close_stops_the_thread_and_wait_no_longer_blocks():
    out = _rows(500)
    pages = PageWriter(out, block_bytes=out[0].nbytes, ahead_bytes=out[0].nbytes * 10)
    pages.close()
    assert not _writing() and pages.written <= 11 and np.isnan(out[11:]).all()
    pages.wait(500)  # returns at once: a failed stream's caller is never held up
    pages.close()  # idempotent
    empty = PageWriter(np.empty((0, 4), np.float32))
    empty.wait(0)
    empty.close()
    assert empty.written == 0


@pytest.mark.parametrize(("guess", "width"), [(None, 6), (6, 6), (8, 6)])
def test_result_rows_at_the_chunks_width(guess, width):
    """Rows handed out block by block add up to one [n, width] array whatever the guess: made at the first chunk
    without one, at once with a right one, and made again (the first writer stopped) with a wrong one."""
    result = ResultRows(10, guess)
    with pytest.raises(RuntimeError, match="no chunk"):
        _ = ResultRows(10, None).array
    for start, stop in ((0, 4), (4, 9), (9, 10)):
        rows = result.rows(start, stop - start, width)
        assert rows.shape == (stop - start, width)
        rows[...] = np.arange(start, stop)[:, None]
    result.close()
    result.close()  # idempotent
    assert not _writing()
    np.testing.assert_array_equal(result.array, np.repeat(np.arange(10, dtype=np.float32)[:, None], width, axis=1))
