"""Where a ``distributed-encode`` rank spends its time, against ``Embedder.encode`` in the same process (issue 23).

The parent builds a random-weight model (``gpu_checks.random_model``), fits a whitening calibrator on STS
sentences, saves it and writes ``--rows`` STS lines to a file, as ``gpu_checks.py scaleout`` does. A child process
(cold, like a rank: ``OMP_NUM_THREADS=1`` as torchrun sets it) then loads the fitted model and times, in order:

``store_cold``
    ``encode_file_to_store`` on the file (world size 1, no torchrun: the rank's own code, warm-up included).
``store_warm``
    the same again (``overwrite``) in the same process.
``stream_no_write``
    the rank's encode loop (``iter_calibrated`` over the file's lines, same chunk size) without writing shards.
``embedder_default`` / ``embedder_same_chunks``
    ``Embedder.encode`` on the lines as a list, default chunking and then the store's chunk size.

Each run reports rows/s and a breakdown of the main thread's seconds: waiting for a prepared (tokenised) chunk,
launching forward passes, waiting for a chunk's result on the device (``finish``: the sync and copy to the host),
in the consumer (between two chunks handed out: shard writing and waiting for the previous shard's commit).

    PYTHONPATH=src:benchmarks python3 benchmarks/rank_profile.py --tokenizer-dir TOK --data-dir STS --rows 300000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch


class Timers:
    """Seconds per label, summed over calls of the wrapped functions."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[label] += time.perf_counter() - t
                self.calls[label] += 1

        return timed

    def wrap_iter(self, label: str, it: Iterator[Any], consumer: str | None = None) -> Iterator[Any]:
        """Time each ``next`` of ``it`` under ``label`` and, if ``consumer``, the time between items under it."""
        while True:
            t = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                self.seconds[label] += time.perf_counter() - t
                return
            self.seconds[label] += time.perf_counter() - t
            self.calls[label] += 1
            t = time.perf_counter()
            yield item
            if consumer:
                self.seconds[consumer] += time.perf_counter() - t

    def report(self) -> dict[str, Any]:
        return {k: {"s": round(v, 3), "calls": self.calls[k]} for k, v in sorted(self.seconds.items())}


@contextlib.contextmanager
def instrumented(encoder: Any, timers: Timers) -> Iterator[None]:
    """Patch the encoder's runner (launch, finish), the prefetcher's hand-over, the shard writer and the calibrated
    stream so that ``timers`` collects the main thread's seconds; restore them afterwards."""
    import bertflow.embedder as embedder_module
    import bertflow.scale.shards as shards
    from bertflow.encoding import batching

    runner = encoder._runner
    saved = [
        (runner, "launch", runner.launch),
        (runner, "finish", runner.finish),
        (batching.Prefetcher, "__iter__", batching.Prefetcher.__iter__),
        (shards.ShardWriter, "write", shards.ShardWriter.write),
        (shards.ShardWriter, "commit", shards.ShardWriter.commit),
        (embedder_module, "iter_calibrated", embedder_module.iter_calibrated),
    ]
    original_iter = batching.Prefetcher.__iter__
    original_calibrated = embedder_module.iter_calibrated
    runner.launch = timers.wrap("main: launch forward passes", runner.launch)
    runner.finish = timers.wrap("main: finish (device sync + host copy)", runner.finish)
    batching.Prefetcher.__iter__ = lambda self: timers.wrap_iter("main: wait for prepared chunk", original_iter(self))
    shards.ShardWriter.write = timers.wrap("consumer: shard write (queue)", shards.ShardWriter.write)
    shards.ShardWriter.commit = timers.wrap("committer thread: commit (fsync, rename)", shards.ShardWriter.commit)
    embedder_module.iter_calibrated = lambda *a, **k: timers.wrap_iter(
        "stream: next chunk", original_calibrated(*a, **k), consumer="consumer: between chunks"
    )
    try:
        yield
    finally:
        for obj, name, value in saved:
            if obj is runner:
                vars(runner).pop(name, None)  # the bound methods of its class again
            else:
                setattr(obj, name, value)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def child(args: argparse.Namespace) -> dict[str, Any]:
    from bertflow import Embedder
    from bertflow.embedder import iter_calibrated
    from bertflow.scale.encode import encode_file_to_store

    work = args.work
    t = time.perf_counter()
    emb = Embedder.load(work / "fitted", device=args.device)
    load_s = time.perf_counter() - t
    text = work / "input.txt"
    lines = text.read_text(encoding="utf-8").splitlines()
    out: dict[str, Any] = {"load_s": round(load_s, 3), "runs": {}}

    def timed(name: str, fn: Callable[[], Any]) -> None:
        timers = Timers()
        sync()
        t0 = time.perf_counter()
        with instrumented(emb.encoder, timers):
            result = fn()
        sync()
        wall = time.perf_counter() - t0
        entry: dict[str, Any] = {"wall_s": round(wall, 3), "rows_per_s": round(len(lines) / wall)}
        if isinstance(result, dict):  # a store summary: its own timed phase and shard times
            rank = result["per_rank"][0]
            entry["store_rows_per_s"] = result["rows_per_second"]
            entry["store_seconds"] = result["seconds"]
            entry["warmup_s"] = rank.get("warmup_seconds")
            entry["shard_seconds"] = rank["shard_seconds"]
        entry["breakdown"] = timers.report()
        out["runs"][name] = entry
        print(name, json.dumps(entry), flush=True)

    def store(name: str) -> Callable[[], Any]:
        return lambda: encode_file_to_store(
            text,
            work / name,
            emb.encoder,
            calibrator=emb.calibrator,
            chunk_size=args.chunk_size,
            shard_size=args.shard_size,
            overwrite=True,
        )

    def stream() -> None:
        with open(text, encoding="utf-8") as fh:
            for _ in iter_calibrated(
                emb.encoder, emb.calibrator, (s.rstrip("\n") for s in fh), chunk_size=args.chunk_size
            ):
                pass

    import dataclasses

    timed("store_cold", store("store0"))
    timed("store_warm", store("store1"))
    timed("stream_no_write", stream)
    timed("embedder_default", lambda: emb.encode(lines, show_progress_bar=False))
    default = emb.encoder.settings
    emb.encoder.settings = dataclasses.replace(default, chunk_size=args.chunk_size)
    timed("embedder_same_chunks", lambda: emb.encode(lines, show_progress_bar=False))
    emb.encoder.settings = default
    timed("store_warm_again", store("store2"))
    timed("embedder_default_again", lambda: emb.encode(lines, show_progress_bar=False))
    if args.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        store("store3")()
        prof.disable()
        with open(args.cprofile, "w") as fh:
            pstats.Stats(prof, stream=fh).sort_stats("tottime").print_stats(40)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--shard-size", type=int, default=131072)
    parser.add_argument("--arch", default="bert-base")
    parser.add_argument("--cprofile", default="", help="also write a cProfile (main thread) of one warm store run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test the script")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("CHILD " + json.dumps(child(args)), flush=True)
        return
    from gpu_checks import card, random_model, sts_pool

    from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator

    with tempfile.TemporaryDirectory(prefix="bertflow-rank-") as tmp:
        work = Path(tmp)
        model = random_model(args.arch, args.tokenizer_dir, work / "model")
        pool = sts_pool(args.data_dir)
        lines = [pool[i % len(pool)] for i in range(args.rows)]
        (work / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        emb = Embedder(SentenceEncoder(str(model), pooling="mean", device=args.device), WhiteningCalibrator())
        emb.fit(pool[:20000]).save(work / "fitted")
        del emb
        cmd = [sys.executable, __file__, "--child", "--work", str(work), *sys.argv[1:]]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        print(proc.stdout[-6000:])
        if proc.returncode:
            print(proc.stderr[-4000:], file=sys.stderr)
            raise SystemExit(proc.returncode)
        result = json.loads([x for x in proc.stdout.splitlines() if x.startswith("CHILD ")][-1][6:])
    result.update(card=card(), rows=args.rows, chunk_size=args.chunk_size, command=" ".join(sys.argv))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
