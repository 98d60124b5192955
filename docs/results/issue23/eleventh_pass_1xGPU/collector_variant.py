"""Issue 23, eleventh pass, call j: a measurement prototype, not the library's code. The main thread launches each
chunk and hands it to a collector thread, which waits for the device and copies the vectors out
(``ModelRunner.finish``), so the main thread never waits in ``finish`` and launches the next chunk as soon as it is
prepared. At most ``DEPTH`` launched chunks wait to be collected. Patched into ``SentenceEncoder`` for every device
(``python collector_variant.py collector|def script.py args...``); on CPU it must give the same vectors as main
(``python collector_variant.py --check``).
"""

from __future__ import annotations

import queue
import runpy
import sys
import threading

import bertflow.encoding.encoder as encoder_module
import bertflow.encoding.stream as stream

DEPTH = 2
_END = object()


def stream_chunks_collected(
    sentences,
    *,
    runner,
    plan,
    settings,
    device,
    prepare,
    start_pool,
    stats,
    batch_size,
    chunk_size,
    max_tokens,
    transform=None,
    progress=None,
    into=None,
):
    budget = max_tokens or settings.token_budget(device.type, runner.dim)
    prepared, prefetcher = stream._prepared_chunks(
        sentences, settings, device, prepare, start_pool, budget, batch_size, chunk_size
    )
    launched: queue.Queue = queue.Queue(maxsize=DEPTH)
    done: queue.Queue = queue.Queue()
    cpu = device.type == "cpu"

    def collect() -> None:
        while True:
            pending = launched.get()
            if pending is _END:
                done.put(_END)
                return
            try:
                done.put(stream._collect(runner, pending, cpu, progress, into))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                done.put(e)
                done.put(_END)
                return

    collector = threading.Thread(target=collect, name="bertflow-collect", daemon=True)
    collector.start()
    error = None
    try:
        while True:
            try:
                chunk = next(prepared)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001
                error = e
                break
            pending = runner.launch(chunk, plan, transform, None, settings.cudnn_attention, settings.unpadded)
            stats.add(chunk)
            launched.put(pending)
            while not done.empty():
                item = done.get()
                if isinstance(item, BaseException):
                    raise item
                if item is not _END:
                    yield item
        launched.put(_END)
        while (item := done.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if prefetcher is not None:
            prefetcher.close()
    if error is not None:
        raise error


def check() -> None:
    """On CPU: main's vectors and the collector's are the same, over several chunks."""
    import numpy as np

    from bertflow import SentenceEncoder
    from bertflow.encoding.settings import EncodeSettings

    sentences = [f"sentence number {i} about {'cats' if i % 3 else 'dogs'} and more words {i % 7}" for i in range(600)]
    enc = SentenceEncoder(device="cpu", settings=EncodeSettings(chunk_size=128))
    want = enc.encode(sentences, show_progress_bar=False)
    encoder_module.stream_chunks = stream_chunks_collected
    got = enc.encode(sentences, show_progress_bar=False)
    parts = list(enc.iter_encode(sentences, chunk_size=128))
    print("max abs diff encode", float(np.abs(want - got).max()), "iter_encode rows", sum(len(p) for p in parts))
    assert np.array_equal(want, got) and np.array_equal(np.concatenate(parts), want)


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check()
        raise SystemExit(0)
    if sys.argv[1] == "collector":
        encoder_module.stream_chunks = stream_chunks_collected
    elif sys.argv[1] != "def":
        raise SystemExit(f"unknown variant {sys.argv[1]}")
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
