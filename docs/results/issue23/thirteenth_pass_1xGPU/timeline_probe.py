"""Issue 23, thirteenth pass: a timeline of each chunk of a pass, to see where the main thread's waits for prepared
chunks come from. Run from the folder that holds ``tok/`` and ``sts/`` (as ``.speed/gpu`` does):

    python timeline_probe.py ARCH [SETTINGS]   # e.g. minilm-l6 tokenize_processes=12 (EncodeSettings fields)

One process: a warm-up encode, then passes over 40,000 STS sentences 0.3 s apart. For each pass, each chunk's
events in ms from the pass's start: on its tokenisation thread, when ``prepare_chunk`` began, when the chunk had
all of the pool's workers (the dispatch lock and the idle workers), when its parts were sent, when the last reply
came, when it was prepared; on the main thread, when the main thread asked for it, got it, launched it and finished
collecting it. Wraps the methods by copies with clocks (this checkout's code; a probe, not the library).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]

EVENTS: list[tuple[float, str, int, str]] = []  # (time, event, chunk offset or -1, thread)


def mark(event: str, offset: int = -1) -> None:
    EVENTS.append((time.perf_counter(), event, offset, threading.current_thread().name))


def instrument() -> None:
    from bertflow.encoding import batching, encoder, forward, tokenizer_pool

    prepare = encoder.SentenceEncoder.prepare_chunk

    def timed_prepare(self, item, *a, **k):
        mark("prep start", item[0])
        LOCAL.offset = item[0]
        out = prepare(self, item, *a, **k)
        mark("prep end", item[0])
        return out

    encoder.SentenceEncoder.prepare_chunk = timed_prepare

    def timed_tokenize(self, sentences):  # TokenizerPool.tokenize with clocks
        off = getattr(LOCAL, "offset", -1)
        n = len(sentences)
        parts = max(1, min(self.processes, n // tokenizer_pool.MIN_PART))
        bounds = np.linspace(0, n, parts + 1).astype(np.int64).tolist()
        taken, replies = [], []
        mark("pool wait", off)
        with self._dispatch:
            mark("pool lock", off)
            for a, b in itertools.pairwise(bounds):
                k = self._idle.get()
                taken.append(k)
                self._conns[k].send(list(sentences[a:b]))
        mark("pool sent", off)
        for k in taken:
            replies.append(self._conns[k].recv())
            self._idle.put(k)
        mark("pool replies", off)
        out = tokenizer_pool.TokenArrays.concatenate(replies)
        mark("pool concat", off)
        return out

    tokenizer_pool.TokenizerPool.tokenize = timed_tokenize

    untimed = batching.Prefetcher.__iter__

    def timed_iter(self):
        it = untimed(self)
        while True:
            mark("main asks")
            try:
                item = next(it)
            except StopIteration:
                return
            mark("main got", item.offset)
            yield item

    batching.Prefetcher.__iter__ = timed_iter
    launch, finish = forward.ModelRunner.launch, forward.ModelRunner.finish

    def timed_launch(self, chunk, *a, **k):
        out = launch(self, chunk, *a, **k)
        mark("launched", chunk.offset)
        return out

    def timed_finish(self, pending, *a, **k):
        mark("finish start", pending.offset)
        out = finish(self, pending, *a, **k)
        mark("finish end", pending.offset)
        return out

    forward.ModelRunner.launch, forward.ModelRunner.finish = timed_launch, timed_finish


LOCAL = threading.local()


def report(start: float, end: float) -> None:
    rows = [e for e in EVENTS if start <= e[0] <= end]
    for t, event, off, thread in rows:
        print(f"    {1e3 * (t - start):7.1f} ms  {event:13s} chunk {off:>6}  {thread}")


def main(arch: str, spec: str) -> None:
    import tempfile

    import gpu_checks as g
    import torch

    from bertflow import SentenceEncoder
    from bertflow.encoding.settings import EncodeSettings

    instrument()
    pool = g.sts_pool(Path("sts"))
    rng = np.random.default_rng(0)
    cuda = torch.cuda.is_available()  # off CUDA: a small dry run of the probe itself
    text = [pool[i] for i in rng.permutation(np.arange(40000 if cuda else 3000) % len(pool))]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        model = g.random_model(arch, Path("tok"), Path(tmp) / arch)
        enc = SentenceEncoder(
            str(model),
            pooling="mean",
            device="cuda" if cuda else "cpu",
            settings=EncodeSettings(**g.setting_fields(spec)),
        )
        warm = g.synthetic(Path("tok"), 20000 if cuda else 500)
        t = time.perf_counter()
        enc.encode(warm, show_progress_bar=False)  # the first encode: graph captures, kernel loads
        sync()
        first_s = time.perf_counter() - t
        t = time.perf_counter()
        enc.encode(warm, show_progress_bar=False)
        sync()
        second_s = time.perf_counter() - t
        memory = (
            {
                k: round(f() / 2**20)
                for k, f in (
                    ("allocated_mib", torch.cuda.memory_allocated),
                    ("reserved_mib", torch.cuda.memory_reserved),
                )
            }
            if cuda
            else {}
        )
        print(f"  warm-up encode of {len(warm)} sentences: first {first_s:.3f} s, second {second_s:.3f} s; {memory}")
        rates = []
        for k in range(4):
            sync()
            time.sleep(0.3)
            t = time.perf_counter()
            enc.encode(text, show_progress_bar=False)
            sync()
            end = time.perf_counter()
            rates.append(round(len(text) / (end - t)))
            if k in (0, 2):
                print(f"  pass {k + 1}: {rates[-1] / 1e3:.1f}k/s, {1e3 * (end - t):.1f} ms")
                report(t, end)
        print(
            json.dumps(
                {
                    "arch": arch,
                    "settings": spec,
                    "rates": rates,
                    "first_encode_s": round(first_s, 3),
                    "second_encode_s": round(second_s, 3),
                    **memory,
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
