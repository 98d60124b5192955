"""The chunk pipeline (bertflow.encoding.stream): chunk sizes, order across chunks, tokenisation threads, errors
after earlier chunks, abandoned streams, progress and the encode statistics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from bertflow import InputError, SentenceEncoder
from bertflow.encoding.settings import EncodeSettings
from bertflow.encoding.stream import chunk_sizes

from ..conftest import SENTENCES
from .test_encoder import LONGER


def test_chunk_sizes_ramp_up_on_cuda_only():
    """On CUDA the first chunks double from ``first_chunk`` up to 16,384 (the GPU starts early); on CPU every chunk
    has the default size; a chunk size asked for (in the call or the settings) wins everywhere."""
    settings = EncodeSettings(first_chunk=4096)
    assert list(itertools.islice(chunk_sizes(settings, "cuda", None), 4)) == [4096, 8192, 16384, 16384]
    assert list(itertools.islice(chunk_sizes(settings, "cpu", None), 2)) == [16384, 16384]
    assert list(itertools.islice(chunk_sizes(settings, "cuda", 7), 2)) == [7, 7]
    fixed = EncodeSettings(chunk_size=5)
    assert list(itertools.islice(chunk_sizes(fixed, "cuda", None), 2)) == [5, 5]
    assert list(itertools.islice(chunk_sizes(fixed, "cpu", 3), 2)) == [3, 3]


def test_chunked_stream_equals_list(tiny_encoder):
    ref = tiny_encoder.encode(SENTENCES)
    parts = list(tiny_encoder.iter_encode(iter(SENTENCES), batch_size=2, chunk_size=3))
    assert [len(p) for p in parts] == [3, 3, 2]
    np.testing.assert_allclose(np.concatenate(parts), ref, atol=1e-5)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_token_budget_and_workers_do_not_change_embeddings(tiny_model_dir, workers):
    ref = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_workers=0).encode(LONGER, batch_size=1)
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_workers=workers)
    for max_tokens in (1, 16, 50, 10**6):
        np.testing.assert_allclose(enc.encode(LONGER, max_tokens=max_tokens), ref, atol=1e-5)
    parts = list(enc.iter_encode(iter(LONGER * 3), chunk_size=5, max_tokens=40))
    assert [len(p) for p in parts] == [5, 5, 5, 5, 5, 5, 5, 1]
    np.testing.assert_allclose(np.concatenate(parts), np.concatenate([ref] * 3), atol=1e-5)


def test_stats_count_real_and_padded_tokens(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu")
    enc.encode(LONGER, max_tokens=10**6)
    stats = enc.last_stats
    lengths = [len(ids) for ids in enc.tokenize(LONGER)]
    assert stats.sentences == len(LONGER) and stats.real_tokens == sum(lengths)
    assert stats.padded_tokens >= stats.real_tokens and 0 < stats.padding_efficiency <= 1
    enc.encode(LONGER, max_tokens=1)  # one sentence per batch: no padding at all
    assert enc.last_stats.padding_efficiency == 1.0 and enc.last_stats.uniform_batches == len(LONGER)


def test_stream_error_names_the_row_after_earlier_chunks(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_workers=2)
    stream = (s for s in [*SENTENCES[:5], "  ", *SENTENCES])
    got = []
    with pytest.raises(InputError, match="sentence 5 is empty"):
        for part in enc.iter_encode(stream, chunk_size=2):
            got.append(part)
    assert sum(len(p) for p in got) == 4  # the chunks before the bad one were delivered


def test_abandoned_stream_stops_its_threads(tiny_model_dir, monkeypatch):
    """Closing ``iter_encode`` stops the stream's tokenisation threads before ``close()`` returns, even while the
    inner chunk stream is still referenced (Python 3.12 may close a generator without running its frame and keep
    its locals, the inner stream among them, until it is freed: the threads ran on)."""
    import threading

    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_workers=2)
    streams = []
    chunks = enc._iter_chunks
    monkeypatch.setattr(enc, "_iter_chunks", lambda *a, **k: streams.append(chunks(*a, **k)) or streams[-1])
    before = set(threading.enumerate())
    for _ in range(3):
        it = enc.iter_encode(iter(SENTENCES * 50), chunk_size=4)
        next(it)
        assert set(threading.enumerate()) - before  # the stream's threads run
        it.close()
        assert not set(threading.enumerate()) - before, sorted(t.name for t in threading.enumerate())
    assert len(streams) == 3


def test_progress_moves_per_batch_within_a_chunk(tiny_model_dir, monkeypatch):
    """On CPU a chunk holds 16,384 sentences (minutes for a real model): progress is told after every forward
    batch, before the chunk is handed out, and the counts add up to the input."""
    enc = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu", max_tokens=64, tokenize_workers=0)
    forwards = []
    forward = enc._runner.forward
    monkeypatch.setattr(enc._runner, "forward", lambda batch, *a: forwards.append(batch.rows) or forward(batch, *a))
    sentences = SENTENCES * 2
    updates: list[int] = []
    parts = enc.iter_encode(sentences, progress=updates.append)
    first = next(parts)
    assert len(first) == len(sentences) and enc.last_stats.chunk_sizes == [len(sentences)]  # one chunk
    assert len(updates) == len(forwards) >= 4 and updates == forwards  # several updates inside that chunk
    assert sum(updates) == len(sentences)
    assert next(parts, None) is None
    # encode forwards the same counts to its caller (a bar spanning several calls) and returns the same rows.
    updates.clear()
    np.testing.assert_array_equal(enc.encode(sentences, progress=updates.append), first)
    assert len(updates) >= 4 and sum(updates) == len(sentences)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_every_chunk_lands_in_its_own_rows(tiny_model_dir, device):
    """Each chunk is copied from the device into the rows it belongs to (encode: its result; iter_encode: a new
    array per chunk, never reused by a later one), and a bad value in a later chunk still names its row."""
    enc = SentenceEncoder(str(tiny_model_dir), device=device, settings=EncodeSettings(chunk_size=3))
    sentences = SENTENCES * 2
    parts = list(enc.iter_encode(iter(sentences), chunk_size=3))
    held = [p.copy() for p in parts]
    whole = enc.encode(sentences)
    assert [len(p) for p in parts] == [len(sentences[i : i + 3]) for i in range(0, len(sentences), 3)]
    for p, h in zip(parts, held, strict=True):  # later chunks wrote elsewhere
        np.testing.assert_array_equal(p, h)
    np.testing.assert_array_equal(whole, np.concatenate(parts))

    calls = []

    def poison(x: torch.Tensor) -> torch.Tensor:  # the second chunk's second row overflows
        calls.append(len(x))
        scale = torch.ones(len(x), 1, device=x.device)
        if len(calls) == 2:
            scale[1] = 1e30
        return x * scale

    with pytest.raises(InputError, match="at row 4, column"):
        enc.encode(sentences, transform=poison)


@pytest.mark.parametrize("device", DEVICES)
def test_encode_result_pages_written_ahead(tiny_model_dir, device, monkeypatch):
    """``encode`` of more than ``first_chunk`` sentences writes its result's pages on a thread ahead of the chunks,
    and on CUDA ``iter_encode`` each fresh chunk array's (page faults off the calling thread; by default on CUDA
    only): the vectors equal the chunk stream's for one pooling and for several (the width the result was made
    with) and with a transform that keeps or reduces the width, and a stream that fails or is abandoned leaves no
    such thread behind."""
    import threading

    from bertflow.encoding import prefault

    assert EncodeSettings().prefaults("cuda") and not EncodeSettings().prefaults("cpu")
    assert not EncodeSettings(prefault=False).prefaults("cuda") and EncodeSettings(prefault=True).prefaults("cpu")
    with pytest.raises(InputError, match="prefault must be None, True or False"):
        EncodeSettings(prefault="yes")
    started = []

    class Counted(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(prefault, "threading", type("T", (), {"Thread": Counted, "Condition": threading.Condition}))

    def threads(run):  # (run's result, the pre-fault threads it started)
        before = len(started)
        return run(), len(started) - before

    settings = EncodeSettings(first_chunk=2, prefault=True)
    enc = SentenceEncoder(str(tiny_model_dir), pooling="mean", device=device, settings=settings)
    sentences = SENTENCES * 3
    # iter_encode's chunks are fresh arrays, written ahead one thread each on CUDA (on CPU a chunk is the computed
    # tensor itself, nothing is copied).
    chunks, n = threads(lambda: list(enc.iter_encode(iter(sentences))))
    assert (len(chunks) > 1 and n == len(chunks)) if device == "cuda" else n == 0
    streamed = np.concatenate(chunks)
    assert threads(lambda: np.testing.assert_array_equal(enc.encode(sentences), streamed))[1] == 1
    both, n = threads(lambda: enc.encode(sentences, poolings=["mean", "cls"]))
    assert n == 1
    cls = np.concatenate([part["cls"] for part in enc.iter_encode(iter(sentences), poolings=["cls"])])
    np.testing.assert_array_equal(both["mean"], streamed)
    np.testing.assert_array_equal(both["cls"], cls)
    assert not np.array_equal(both["mean"], both["cls"])
    with pytest.raises(InputError, match="sentence 1 is empty"):
        enc.encode([sentences[0], "  ", *sentences])
    stream = enc.iter_encode(iter(sentences))
    next(stream)
    stream.close()  # abandoned with a chunk in flight
    assert not [t for t in threading.enumerate() if t.name == "bertflow-prefault"]
    # A transform that keeps the width uses the array made at the encoder's width; one that reduces it gets a new
    # array (and a new thread) at its first chunk, and the first thread is stopped.
    assert (
        threads(lambda: np.testing.assert_array_equal(enc.encode(sentences, transform=lambda x: x * 2), streamed * 2))[
            1
        ]
        == 1
    )
    narrowed, n = threads(lambda: enc.encode(sentences, transform=lambda x: x[:, :3] * 2))
    np.testing.assert_array_equal(narrowed, streamed[:, :3] * 2)
    assert n == 2
    # Told the transform's width, it makes the result at that width at once.
    told, n = threads(lambda: enc.encode(sentences, transform=lambda x: x[:, :3] * 2, transform_dim=3))
    np.testing.assert_array_equal(told, narrowed)
    assert n == 1
    with pytest.raises(InputError, match="transform_dim must be a positive integer"):
        enc.encode(sentences, transform=lambda x: x, transform_dim=0)
    # An empty input takes its width from transform_dim when told, else from the transform run on zero rows.
    calls = []

    def narrow(x):
        calls.append(x.shape[0])
        return x[:, :3]

    assert enc.encode([], transform=narrow, transform_dim=3).shape == (0, 3) and calls == []
    assert enc.encode([], transform=narrow).shape == (0, 3) and calls == [0]
    assert not [t for t in threading.enumerate() if t.name == "bertflow-prefault"]
    # Up to first_chunk sentences (one chunk), or with prefault=False, no thread starts.
    assert threads(lambda: enc.encode(sentences[:2]))[1] == 0
    enc.settings = EncodeSettings(first_chunk=2, prefault=False)
    assert threads(lambda: np.testing.assert_array_equal(enc.encode(sentences), streamed))[1] == 0
    assert threads(lambda: list(enc.iter_encode(iter(sentences))))[1] == 0
    assert not [t for t in threading.enumerate() if t.name == "bertflow-prefault"]
