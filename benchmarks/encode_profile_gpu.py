"""Where encoding time goes on a GPU (issue 23): the unpadded forward's device time, and MiniLM's host time.

``forward``
    For each architecture, the real forward batches of one 65,536-sentence STS chunk (built by the encoder's own
    batching), run through ``ModelRunner.forward`` padded and unpadded in each of ``--variants`` (an attention of
    ``ATTENTIONS`` and the layer kernels of ``KERNELS``, e.g. ``segments:fused``), with each one's largest 1 - cos
    against the padded bf16 and float32 vectors:
    host time to queue the chunk, time to finish it (device events), host synchronisations caught by
    ``torch.cuda.set_sync_debug_mode``, and the top CUDA kernels of the ``--profile`` variants (torch.profiler).
    Medians of ``--rounds``.
``host``
    MiniLM-L6 ``SentenceEncoder.encode`` on STS text, first pass then ``--rounds`` warm passes, each split into:
    chunk preparation on the tokenisation threads (worker round trip vs sorting and packing), queueing on the
    main thread, waiting for results, and Python's garbage collections in the main process.
``timeline``
    ``SentenceEncoder.encode`` per architecture and per ``--settings`` variant (``;``-separated
    ``field=value,...`` of ``EncodeSettings``, ``default`` for none; ``switch=S`` sets ``sys.setswitchinterval``),
    each its own encoder (so a cold word memo): first pass then ``--rounds`` warm passes on STS text, each with
    a timeline per chunk (preparation on its thread, queueing on the main thread, the device's start and end of
    the chunk from CUDA events, the wait for the result), the device's idle time, CUDA / pinned allocations made
    during the pass, and a cProfile of the main thread in one more warm pass (``--out-dir``).

    PYTHONPATH=src python3 benchmarks/encode_profile_gpu.py forward --tokenizer-dir TOK --data-dir STS --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_checks import random_model, setting_fields, sts_pool, synthetic  # noqa: E402


def sts_text(data_dir: Path, n: int, seed: int = 0) -> list[str]:
    pool = sts_pool(data_dir)
    rng = np.random.default_rng(seed)
    return [pool[i] for i in rng.permutation(np.arange(n) % len(pool))]


def set_variant(runner: Any, variant: str) -> bool:
    """Point ``runner`` at ``variant`` (``padded``, or ``ATTENTION[:KERNELS]``, e.g. ``segments:fused``; no
    kernels: the CUDA default) and return whether it is unpadded."""
    from bertflow.encoding.packed import ATTENTIONS, CUDA_KERNELS

    if variant == "padded":
        return False
    attention, _, kernels = variant.partition(":")
    runner.cuda_attention = ATTENTIONS[attention]
    runner.packed.kernels = kernels or CUDA_KERNELS
    return True


def timed_chunk(runner: Any, chunk: Any, plan: Any, variant: str) -> tuple[float, float]:
    """(host seconds to queue every batch, seconds until the device finished them); ``variant``: see
    :func:`set_variant`."""
    unpadded = set_variant(runner, variant)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for batch in chunk.batches:
        runner.forward(batch, plan, False, unpadded)
    end.record()
    host = time.perf_counter() - t
    end.synchronize()
    return host, start.elapsed_time(end) / 1000


def chunk_vectors(runner: Any, chunk: Any, plan: Any, variant: str) -> torch.Tensor:
    """The pooled vectors of every batch of ``chunk`` under ``variant`` (batch order), float32 on the device."""
    unpadded = set_variant(runner, variant)
    return torch.cat([runner.forward(batch, plan, False, unpadded) for batch in chunk.batches])


def forward(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bertflow import SentenceEncoder
    from bertflow.encoding.packed import max_cosine_deviation
    from bertflow.encoding.settings import EncodeSettings

    text = sts_text(args.data_dir, 65536)
    out: dict[str, Any] = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": {}}
    for arch in args.archs.split(","):
        model = random_model(arch, args.tokenizer_dir, work / arch)
        enc = SentenceEncoder(str(model), pooling="mean", device="cuda", settings=EncodeSettings(tokenize_processes=0))
        chunk = enc.prepare_chunk((0, text), enc.token_budget, None, pooled=False)
        plan, runner = enc._plan(None), enc._runner
        real = chunk.real_tokens
        res: dict[str, Any] = {"batches": len(chunk.batches), "real_tokens": real, "padded_tokens": chunk.padded_tokens}
        variants = ["padded", *args.variants.split(",")]
        for _ in range(2):  # warm-up
            for name in variants:
                timed_chunk(runner, chunk, plan, name)
        reference = chunk_vectors(runner, chunk, plan, "padded")
        ref32 = SentenceEncoder(str(model), pooling="mean", device="cuda", dtype="float32")
        vectors32 = chunk_vectors(ref32._runner, chunk, plan, "padded")
        del ref32
        for name in variants:
            flag = name
            runs = [timed_chunk(runner, chunk, plan, flag) for _ in range(args.rounds)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    timed_chunk(runner, chunk, plan, flag)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            device = statistics.median(r[1] for r in runs)
            res[name] = {
                "host_queue_s": round(statistics.median(r[0] for r in runs), 5),
                "device_s": round(device, 5),
                "sentences_per_s": round(len(text) / device),
                "real_tokens_per_s": round(real / device),
                "syncs": sorted({str(w.message)[:160] for w in caught}),
                "sync_count": len(caught),
            }
            got = chunk_vectors(runner, chunk, plan, name)
            res[name]["max_1_minus_cos_vs_padded_bf16"] = max_cosine_deviation(got, reference)
            res[name]["max_1_minus_cos_vs_padded_fp32"] = max_cosine_deviation(got, vectors32)
            if name not in args.profile.split(","):
                continue
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                timed_chunk(runner, chunk, plan, flag)
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
            (args.out_dir / f"profile_{arch}_{name.replace(':', '_')}.txt").write_text(table)
        for name in variants[1:]:
            res[name]["speedup_vs_padded"] = round(res["padded"]["device_s"] / res[name]["device_s"], 3)
        out["runs"][arch] = res
        print(json.dumps({arch: res}, indent=1), flush=True)
        enc.close()
        del enc
        torch.cuda.empty_cache()
    return out


class Clock:
    """Adds up seconds per label, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self.most: dict[str, float] = {}

    def add(self, label: str, seconds: float) -> None:
        with self.lock:
            self.total[label] = self.total.get(label, 0.0) + seconds
            self.count[label] = self.count.get(label, 0) + 1
            self.most[label] = max(self.most.get(label, 0.0), seconds)

    def wrap(self, obj: Any, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(label, time.perf_counter() - t)

        setattr(obj, name, timed)

    def report(self) -> dict[str, Any]:
        return {
            k: {"s": round(v, 4), "n": self.count[k], "max_s": round(self.most[k], 4)} for k, v in self.total.items()
        }


def host(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bertflow import SentenceEncoder

    model = random_model("minilm-l6", args.tokenizer_dir, work / "minilm")
    text = sts_text(args.data_dir, args.sentences)
    enc = SentenceEncoder(str(model), pooling="mean", device="cuda")
    enc.encode(synthetic(args.tokenizer_dir, 20000), show_progress_bar=False)
    clock = Clock()
    clock.wrap(enc.chunk_tokenizer, "tokenize", "tokenize (worker round trip)")
    clock.wrap(enc, "prepare_chunk", "prepare chunk (tokenize + sort + pack)")
    clock.wrap(enc._runner, "launch", "main: queue chunk")
    clock.wrap(enc._runner, "finish", "main: wait for chunk")
    gc_start: dict[str, float] = {}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start["t"] = time.perf_counter()
        elif "t" in gc_start:
            label = f"gc gen{info['generation']} ({threading.current_thread().name})"
            clock.add(label, time.perf_counter() - gc_start["t"])

    gc.callbacks.append(on_gc)
    passes = []
    for r in range(1 + args.rounds):
        clock.total.clear()
        clock.count.clear()
        clock.most.clear()
        torch.cuda.synchronize()
        t = time.perf_counter()
        enc.encode(text, show_progress_bar=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        passes.append(
            {
                "pass": "first" if r == 0 else f"warm {r}",
                "wall_s": round(wall, 4),
                "sentences_per_s": round(len(text) / wall),
                "chunks": enc.last_stats.chunk_sizes,
                "parts": clock.report(),
            }
        )
        print(json.dumps(passes[-1]), flush=True)
    gc.callbacks.remove(on_gc)
    rates = [p["sentences_per_s"] for p in passes[1:]]
    enc.close()
    return {
        "card": torch.cuda.get_device_name(0),
        "passes": passes,
        "warm_min_median_max": [min(rates), statistics.median(rates), max(rates)],
    }


def _setting_variant(spec: str) -> tuple[dict[str, Any], float | None]:
    """``field=value,...`` (or ``default``) -> (EncodeSettings keywords, switch interval or None)."""
    kwargs = setting_fields(spec)
    switch = kwargs.pop("switch", None)  # sys.setswitchinterval before the encoder is made
    if "fast_switch" in kwargs:  # the interval the encoder's prefetcher sets on CUDA (null: none)
        kwargs["_fast_switch"] = kwargs.pop("fast_switch")
    return kwargs, None if switch is None else float(switch)


def _counters() -> dict[str, int]:
    """CUDA segments allocated (cudaMalloc calls) and pinned host allocations so far."""
    stats = torch.cuda.memory_stats()
    out = {"cuda_segments": int(stats.get("segment.all.allocated", 0))}
    try:
        host = torch.cuda.host_memory_stats()
        out["host_allocs"] = int(host.get("num_host_alloc", host.get("allocations.allocated", 0)))
    except (AttributeError, RuntimeError):
        pass
    return out


def traced_pass(enc: Any, text: list[str]) -> dict[str, Any]:
    """One ``enc.encode(text)`` with a per-chunk timeline (seconds from the call; device times from CUDA events)."""
    events: list[dict[str, Any]] = []
    lock = threading.Lock()
    originals = {"prepare": enc.prepare_chunk, "launch": enc._runner.launch, "finish": enc._runner.finish}
    originals["tokenize"] = enc.chunk_tokenizer.tokenize

    def tokenize(sentences: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = originals["tokenize"](sentences, *a, **k)
        with lock:
            events.append({"what": "tokenize", "n": len(sentences), "t0": t, "t1": time.perf_counter()})
        return out

    def prepare(item: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = originals["prepare"](item, *a, **k)
        with lock:
            events.append(
                {
                    "what": "prepare",
                    "row": item[0],
                    "n": out.n,
                    "batches": len(out.batches),
                    "t0": t,
                    "t1": time.perf_counter(),
                    "thread": threading.current_thread().name,
                }
            )
        return out

    def launch(chunk: Any, *a: Any, **k: Any) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        out = originals["launch"](chunk, *a, **k)
        end.record()
        events.append(
            {
                "what": "launch",
                "row": chunk.offset,
                "n": chunk.n,
                "batches": len(chunk.batches),
                "t0": t,
                "t1": time.perf_counter(),
                "ev": (start, end),
            }
        )
        return out

    def finish(pending: Any) -> Any:
        t = time.perf_counter()
        out = originals["finish"](pending)
        events.append({"what": "finish", "row": pending.offset, "t0": t, "t1": time.perf_counter()})
        return out

    enc.prepare_chunk, enc._runner.launch, enc._runner.finish = prepare, launch, finish
    enc.chunk_tokenizer.tokenize = tokenize
    try:
        before = _counters()
        torch.cuda.synchronize()
        base = torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        base.record()
        enc.encode(text, show_progress_bar=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        after = _counters()
    finally:
        del enc.prepare_chunk, enc._runner.launch, enc._runner.finish, enc.chunk_tokenizer.tokenize
    rows = []
    busy = 0.0
    last_end = 0.0
    for e in events:
        row = {k: v for k, v in e.items() if k not in ("t0", "t1", "ev")}
        row["t0"], row["t1"] = round(e["t0"] - t0, 4), round(e["t1"] - t0, 4)
        if "ev" in e:
            g0, g1 = (base.elapsed_time(x) / 1000 for x in e["ev"])
            row["gpu0"], row["gpu1"] = round(g0, 4), round(g1, 4)
            busy += g1 - max(g0, last_end)
            last_end = g1
        rows.append(row)
    launches = [r for r in rows if r["what"] == "launch"]
    return {
        "wall_s": round(wall, 4),
        "sentences_per_s": round(len(text) / wall),
        "batches": sum(r["batches"] for r in launches),
        "first_launch_s": launches[0]["t0"] if launches else None,
        "launch_host_s": round(sum(r["t1"] - r["t0"] for r in launches), 4),
        "gpu_busy_s": round(busy, 4),
        "gpu_last_end_s": round(last_end, 4),
        "allocations": {k: after[k] - before.get(k, 0) for k in after},
        "timeline": rows,
    }


def roundtrip(enc: Any, text: list[str]) -> dict[str, Any]:
    """Median seconds (of 5, warm) to tokenise the first n sentences of ``text``: through the encoder's worker
    processes, in this process with the same WordPiece shortcut, and to prepare (sort, pack) them once tokenised."""
    from bertflow.encoding.batching import prepare_chunk
    from bertflow.encoding.tokenization import tokenize_arrays
    from bertflow.encoding.wordpiece import WordPieceShortcut

    shortcut = WordPieceShortcut.from_tokenizer(enc.chunk_tokenizer.rust)
    out: dict[str, Any] = {}
    for n in (512, 2048, 4096, 16384):
        part = text[:n]
        times: dict[str, list[float]] = {"pool": [], "in_process": [], "prepare": []}
        for _ in range(5):
            t = time.perf_counter()
            tokens = enc.chunk_tokenizer.pool.tokenize(part)
            times["pool"].append(time.perf_counter() - t)
            t = time.perf_counter()
            tokenize_arrays(enc.chunk_tokenizer.rust, part, shortcut)
            times["in_process"].append(time.perf_counter() - t)
            t = time.perf_counter()
            prepare_chunk(
                0,
                tokens,
                max_tokens=enc.token_budget,
                max_rows=None,
                uniform_fill=enc.settings.uniform_fill,
                min_length_ratio=enc.settings.length_ratio(False),
                min_tokens=32768,
                pad_id=0,
                pinned=True,
            )
            times["prepare"].append(time.perf_counter() - t)
        out[str(n)] = {k: round(statistics.median(v), 5) for k, v in times.items()}
    return out


def timeline(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import cProfile
    import io
    import pstats

    from bertflow import SentenceEncoder
    from bertflow.encoding.settings import EncodeSettings

    text = sts_text(args.data_dir, args.sentences)
    warm = synthetic(args.tokenizer_dir, 20000)
    out: dict[str, Any] = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": {}}
    default_switch = sys.getswitchinterval()
    for arch in args.archs.split(","):
        model = random_model(arch, args.tokenizer_dir, work / arch)
        for spec in args.settings.split(";"):
            kwargs, switch = _setting_variant(spec)
            sys.setswitchinterval(switch or default_switch)
            import bertflow.encoding.batching as batching

            fast = getattr(batching, "FAST_SWITCH_INTERVAL", None)
            if "_fast_switch" in kwargs:
                batching.FAST_SWITCH_INTERVAL = kwargs.pop("_fast_switch")
            enc = SentenceEncoder(str(model), pooling="mean", device="cuda", settings=EncodeSettings(**kwargs))
            enc.encode(warm, show_progress_bar=False)
            passes = [traced_pass(enc, text) for _ in range(1 + args.rounds)]
            rates = [p["sentences_per_s"] for p in passes]
            res = {
                "first_pass": rates[0],
                "warm_min_median_max": [min(rates[1:]), statistics.median(rates[1:]), max(rates[1:])],
                "passes": passes,
            }
            print(
                json.dumps(
                    {
                        "arch": arch,
                        "settings": spec,
                        **{k: v for k, v in res.items() if k != "passes"},
                        "batches": passes[-1]["batches"],
                        "fill": [p["first_launch_s"] for p in passes],
                        "launch_host": [p["launch_host_s"] for p in passes],
                        "gpu_busy": [p["gpu_busy_s"] for p in passes],
                        "wall": [p["wall_s"] for p in passes],
                        "allocs": [p["allocations"] for p in passes if any(p["allocations"].values())],
                    }
                ),
                flush=True,
            )
            if args.cprofile and spec == args.settings.split(";")[0]:
                # The main thread in one more warm pass, then queueing one 65,536-sentence chunk with nothing else
                # running (the launch cost without the tokenisation threads).
                chunk = enc.prepare_chunk((0, sts_text(args.data_dir, 65536)), enc.token_budget, None, pooled=False)
                plan = enc._plan(None)
                for _ in range(2):
                    enc._runner.finish(enc._runner.launch(chunk, plan, unpadded=enc.settings.unpadded))
                for label in ("encode", "launch"):
                    torch.cuda.synchronize()
                    prof = cProfile.Profile()
                    t = time.perf_counter()
                    prof.enable()
                    if label == "encode":
                        enc.encode(text, show_progress_bar=False)
                    else:
                        enc._runner.launch(chunk, plan, unpadded=enc.settings.unpadded)
                    prof.disable()
                    host_s = time.perf_counter() - t
                    torch.cuda.synchronize()
                    buf = io.StringIO()
                    buf.write(f"{label}: host {host_s:.4f} s (profiled), {len(chunk.batches)} batches in the chunk\n")
                    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
                    (args.out_dir / f"cprofile_{label}_{arch}.txt").write_text(buf.getvalue())
                torch.cuda.synchronize()
                t = time.perf_counter()
                enc._runner.launch(chunk, plan, unpadded=enc.settings.unpadded)
                res["launch_65536_host_s"] = round(time.perf_counter() - t, 4)
                torch.cuda.synchronize()
                res["launch_65536_total_s"] = round(time.perf_counter() - t, 4)
                res["launch_65536_batches"] = len(chunk.batches)
                print(
                    arch,
                    "launch of one 65,536 chunk: host",
                    res["launch_65536_host_s"],
                    "with device",
                    res["launch_65536_total_s"],
                    flush=True,
                )
            if args.roundtrip and spec == args.settings.split(";")[0]:
                res["roundtrip"] = roundtrip(enc, text)
                print(arch, "tokeniser round trip", json.dumps(res["roundtrip"]), flush=True)
            while f"{arch} {spec}" in out["runs"]:  # a variant named twice keeps both
                spec += " (again)"
            out["runs"][f"{arch} {spec}"] = res
            if hasattr(batching, "FAST_SWITCH_INTERVAL"):
                batching.FAST_SWITCH_INTERVAL = fast
            enc.close()
            del enc
            torch.cuda.empty_cache()
    sys.setswitchinterval(default_switch)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["forward", "host", "timeline"])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--archs", default="bert-base,minilm-l6")
    parser.add_argument(
        "--variants",
        default="slotted:fused-gelu,segments:modules,segments:fused,segments:fused-gelu",
        help="forward: unpadded variants ATTENTION[:KERNELS] timed beside the padded forward",
    )
    parser.add_argument("--profile", default="padded,segments:fused-gelu", help="forward: variants to profile")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settings", default="default", help="timeline: ';'-separated EncodeSettings variants")
    parser.add_argument("--cprofile", action="store_true", help="timeline: cProfile the main thread (first variant)")
    parser.add_argument(
        "--roundtrip", action="store_true", help="timeline: time the tokeniser round trip (first variant)"
    )
    parser.add_argument("--sentences", type=int, default=40000)
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bertflow-prof-") as tmp:
        result = {"forward": forward, "host": host, "timeline": timeline}[args.what](args, Path(tmp))
    result["command"] = " ".join(sys.argv)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
