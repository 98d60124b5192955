"""Tokenising in worker processes: the pool, its workers' lives and deaths, and the encoder's chunk tokeniser."""

from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest
import torch

from bertflow import SentenceEncoder
from bertflow.encoding.tokenization import GC_ENABLED, TokenArrays, tokenize_arrays
from bertflow.encoding.tokenizer_pool import MIN_PART, ChunkTokenizer, TokenizerPool, auto_processes

from ..conftest import SENTENCES
from .test_wordpiece import _edited, _rust

LONGER = [f"{s} and then {i} more words follow here" * (1 + i % 3) for i, s in enumerate(SENTENCES * 3)]


def _split(tokens: TokenArrays) -> list[list[int]]:
    return [tokens.ids[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]


def test_auto_processes_only_on_cuda_with_the_shortcut(tiny_model_dir, monkeypatch):
    from bertflow.encoding import tokenizer_pool

    tok = _rust(tiny_model_dir)
    assert auto_processes("cpu") == 0 and auto_processes("cpu", tok) == 0
    monkeypatch.setattr(tokenizer_pool.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert auto_processes("cuda", tok) == 12  # all but the encoding process's own four
    assert auto_processes("cuda", _edited(tok, pre_tokenizer={"type": "Whitespace"})) == 0  # no shortcut
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun ranks on this host share its cores
    assert auto_processes("cuda", tok) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert auto_processes("cuda", tok) == 0
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(tokenizer_pool.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    assert auto_processes("cuda", tok) == 0
    monkeypatch.setattr(tokenizer_pool.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert auto_processes("cuda", tok) == 12  # at most MAX_AUTO_PROCESSES
    monkeypatch.setattr(tokenizer_pool.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(tokenizer_pool, "_start_method", lambda: "spawn")  # off Linux: never started unasked
    assert auto_processes("cuda", tok) == 0


def test_pool_matches_in_process_tokenisation(tiny_model_dir):
    rust = _rust(tiny_model_dir, max_length=12)
    many = LONGER * (2 * MIN_PART // len(LONGER) + 1)  # enough for two parts
    reference = tokenize_arrays(rust, many)  # uses the Rust thread pool here before the fork below
    pool = TokenizerPool(rust.to_str(), processes=2)
    try:
        for sentences in (many, many[:3], many[: MIN_PART + 1]):
            got = pool.tokenize(sentences)
            assert got.ids.dtype == np.int32 and got.offsets.dtype == np.int64
            expected = tokenize_arrays(rust, sentences)
            np.testing.assert_array_equal(got.offsets, expected.offsets)
            np.testing.assert_array_equal(got.ids, expected.ids)
        assert _split(pool.tokenize(many)) == _split(reference)
        assert max(len(ids) for ids in _split(reference)) == 12  # truncation travelled with the tokenizer
    finally:
        pool.close()
    assert pool.closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.tokenize(many[:2])
    pool.close()  # twice is fine


def test_pool_with_spawned_workers(tiny_model_dir, monkeypatch):
    """The start method used off Linux: a fresh interpreter per worker, same ids."""
    from bertflow.encoding import tokenizer_pool

    monkeypatch.setattr(tokenizer_pool, "_start_method", lambda: "spawn")
    rust = _rust(tiny_model_dir)
    pool = TokenizerPool(rust.to_str(), processes=1)
    try:
        got = pool.tokenize(LONGER)
    finally:
        pool.close()
    expected = tokenize_arrays(rust, LONGER)
    np.testing.assert_array_equal(got.ids, expected.ids)
    np.testing.assert_array_equal(got.offsets, expected.offsets)


def test_pool_stops_its_workers_when_collected(tiny_model_dir):
    import gc

    rust = _rust(tiny_model_dir)
    pool = TokenizerPool(rust.to_str(), processes=2)
    pids = pool.pids
    assert len(pids) == 2
    del pool
    gc.collect()
    for pid in pids:  # joined by the shutdown: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_pool_serves_threads_at_once(tiny_model_dir):
    """Two threads whose lists each need every worker (the encoder's two preparing threads): each gets its own
    ids back, with no deadlock over the workers."""
    from concurrent.futures import ThreadPoolExecutor

    rust = _rust(tiny_model_dir)
    many = LONGER * (2 * MIN_PART // len(LONGER) + 1)
    lists = [many, many[::-1], many[1:], many[:-7]] * 3
    pool = TokenizerPool(rust.to_str(), processes=2)
    try:
        with ThreadPoolExecutor(2) as threads:
            got = list(threads.map(pool.tokenize, lists))
    finally:
        pool.close()
    for sentences, tokens in zip(lists, got, strict=True):
        assert _split(tokens) == _split(tokenize_arrays(rust, sentences))


def _fail(sentences: list[str]) -> TokenArrays:
    """In place of a worker's tokenisation: fails on a list holding "boom", else one id per sentence."""
    if "boom" in sentences:
        raise ValueError("boom in a worker")
    return TokenArrays(np.ones(len(sentences), np.int32), np.arange(len(sentences) + 1, dtype=np.int64))


def test_pool_raises_a_workers_error_and_goes_on(tiny_model_dir, monkeypatch):
    from bertflow.encoding import tokenizer_pool

    monkeypatch.setattr(tokenizer_pool, "_worker_tokenize", _fail)  # found by name in the forked workers
    pool = TokenizerPool(_rust(tiny_model_dir).to_str(), processes=2)
    try:
        with pytest.raises(ValueError, match="boom in a worker"):
            pool.tokenize(["a"] * MIN_PART + ["boom"] * MIN_PART)
        assert not pool.closed  # every reply was read: the workers are in step
        assert pool.tokenize(["a"] * 3).lengths.tolist() == [1, 1, 1]
    finally:
        pool.close()


def test_pool_with_a_dead_worker_is_broken_and_closed(tiny_model_dir):
    from concurrent.futures.process import BrokenProcessPool

    pool = TokenizerPool(_rust(tiny_model_dir).to_str(), processes=2)
    os.kill(pool.pids[1], signal.SIGKILL)
    with pytest.raises(BrokenProcessPool, match="died"):
        pool.tokenize(LONGER * (2 * MIN_PART // len(LONGER) + 1))
    assert pool.closed
    for pid in pool.pids:  # the other worker was stopped too
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_exit_when_their_process_is_killed(tiny_model_dir):
    """A process killed with its pool running (no chance to stop the workers) leaves no worker behind: each sees
    its pipe close, since no other worker holds a copy of the pool's end."""
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from tokenizers import Tokenizer\n"
        "from bertflow.encoding.tokenizer_pool import TokenizerPool\n"
        f"pool = TokenizerPool(Tokenizer.from_file({str(tiny_model_dir / 'tokenizer.json')!r}).to_str(), 3)\n"
        "print(*pool.pids, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
    finally:
        proc.kill()
        proc.wait()
    assert len(pids) == 3
    deadline = time.monotonic() + 20
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in pids if _running(pid)]
    assert not alive, f"workers {alive} outlived their process"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (an exited child of init may linger as a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pool_needs_a_process(tiny_model_dir):
    with pytest.raises(ValueError, match="at least one process"):
        TokenizerPool(_rust(tiny_model_dir).to_str(), processes=0)


def _report_gc(sentences: list[str]) -> TokenArrays:
    """In place of a worker's tokenisation: one sentence whose one id is whether the worker collects garbage and
    has set the heap it inherited aside (frozen objects)."""
    return TokenArrays(np.array([gc.isenabled() and gc.get_freeze_count() > 0], np.int32), np.array([0, 1], np.int64))


def test_workers_collect_garbage_when_started_during_a_tokenisation(tiny_model_dir, monkeypatch):
    """Workers forked while another thread tokenises (the collector paused in this process) collect garbage, but
    not over the heap they inherited (walking it would copy the parent's memory into every worker)."""
    from transformers import AutoTokenizer

    from bertflow.encoding import tokenizer_pool

    monkeypatch.setattr(tokenizer_pool, "_worker_tokenize", _report_gc)  # found by name in the workers
    chunks = ChunkTokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)), 64, "cpu")
    with GC_ENABLED.held(False):  # as while another thread tokenises
        chunks.start(2)
    try:
        assert chunks.tokenize(["a"] * 2 * MIN_PART).ids.tolist() == [1, 1]  # two parts, both answered by workers
    finally:
        chunks.close()


def test_encoder_with_worker_processes_gives_the_same_embeddings(tiny_model_dir):
    ref = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=0)
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=2)
    assert enc.chunk_tokenizer.pool is None  # started only by a stream of more than one chunk
    stream = LONGER * 4
    expected = np.concatenate(list(ref.iter_encode(iter(stream), chunk_size=7)))
    got = np.concatenate(list(enc.iter_encode(iter(stream), chunk_size=7)))
    assert enc.chunk_tokenizer.pool is not None and enc.chunk_tokenizer.pool.processes == 2
    np.testing.assert_allclose(got, expected, atol=1e-5)

    def refuse(sentences):
        raise AssertionError("a single chunk (a query, a small list) went to the worker processes")

    enc.chunk_tokenizer.pool.tokenize = refuse  # a small list is tokenised here: cheaper than the round trip
    np.testing.assert_allclose(enc.encode(stream[:9]), expected[:9], atol=1e-5)
    enc.close()
    assert enc.chunk_tokenizer.pool is None
    np.testing.assert_allclose(enc.encode(stream[:5]), expected[:5], atol=1e-5)  # works after close, in-process


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_workers_forked_from_a_process_using_cuda(tiny_model_dir):
    ref = SentenceEncoder(str(tiny_model_dir), device="cuda", dtype="float32", tokenize_processes=0)
    expected = np.concatenate(list(ref.iter_encode(iter(LONGER * 40), chunk_size=50)))
    enc = SentenceEncoder(str(tiny_model_dir), device="cuda", dtype="float32", tokenize_processes=2)
    for _ in range(2):  # the pool outlives an encode call
        got = np.concatenate(list(enc.iter_encode(iter(LONGER * 40), chunk_size=50)))
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert enc.chunk_tokenizer.pool is not None and not enc.chunk_tokenizer.pool.closed
    enc.close()


def test_dead_worker_falls_back_to_in_process_tokenisation(tiny_model_dir, caplog):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=2)
    ref = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=0).encode(LONGER)
    list(enc.iter_encode(iter(LONGER), chunk_size=10))  # starts the pool
    assert enc.chunk_tokenizer.pool is not None
    for pid in enc.chunk_tokenizer.pool.pids:  # a worker killed for memory, say
        os.kill(pid, signal.SIGKILL)
    with caplog.at_level("WARNING", logger="bertflow.encoding.tokenizer_pool"):
        parts = list(enc.iter_encode(iter(LONGER), chunk_size=10))
    np.testing.assert_allclose(np.concatenate(parts), ref, atol=1e-5)
    assert "worker process died" in caplog.text
    assert enc.tokenize_processes == 0 and enc.chunk_tokenizer.pool is None


def test_with_block_stops_the_workers(tiny_model_dir):
    from bertflow import Embedder, IdentityCalibrator

    with SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=1) as enc:
        list(enc.iter_encode(iter(LONGER), chunk_size=10))
        pool = enc.chunk_tokenizer.pool
        assert pool is not None and not pool.closed
    assert pool.closed and enc.chunk_tokenizer.pool is None
    with Embedder(enc, IdentityCalibrator()).fit(LONGER) as model:
        list(model.encoder.iter_encode(iter(LONGER), chunk_size=10))
        assert model.encoder.chunk_tokenizer.pool is not None
    assert model.encoder.chunk_tokenizer.pool is None


def test_changing_the_process_count_restarts_the_pool(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=1)
    list(enc.iter_encode(iter(LONGER), chunk_size=10))
    first = enc.chunk_tokenizer.pool
    enc.tokenize_processes = 2
    list(enc.iter_encode(iter(LONGER), chunk_size=10))
    assert first is not None and first.closed
    assert enc.chunk_tokenizer.pool is not None and enc.chunk_tokenizer.pool.processes == 2
    enc.tokenize_processes = 0
    list(enc.iter_encode(iter(LONGER), chunk_size=10))
    assert enc.chunk_tokenizer.pool is None


def test_negative_process_count_is_refused(tiny_model_dir):
    from bertflow import InputError

    with pytest.raises(InputError, match="tokenize_processes"):
        SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_processes=-1)


# -- the WordPiece shortcut --------------------------------------------------------------------------------
