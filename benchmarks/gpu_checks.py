"""GPU checks of issues 15 and 17 in one device call: throughput, one encoding path in bf16, scale-out on one GPU.

Subcommands (each prints one JSON object and writes it to ``--json``):

``throughput``
    ``SentenceEncoder.encode`` sentences/s for random-weight BERT-base and MiniLM-L6 (bf16, mean pooling,
    max_length 64) on STS sentences. Only names that every bertflow release exports are used
    (``bertflow.SentenceEncoder``), so the same command times an older checkout beside this one
    (``PYTHONPATH=old/src``) on the same card. After a warm-up on ``--warmup`` random-word sentences, the first
    pass over the STS sentences is the "first-pass" number (the tokeniser has not met their words); the median of
    ``--rounds`` further passes over the same sentences is the "warm" number. ``--counters`` adds each pass's CPU
    counters (:func:`cpu_counters`: the main thread's CPU time, context switches and waits for prepared chunks, the
    process's and each tokeniser worker's CPU time, the machine's busy, idle and stolen core-seconds), to compare a
    slow process with a fast one. ``--ruler`` runs :class:`harness.ruler.Ruler` beside the passes and gives each
    pass's ``ruler_ms``, the host's own speed then (two variants are compared fairly only in the same state).
    ``--pair SETTINGS`` builds a second encoder in the same process with those ``EncodeSettings`` fields, its own
    tokeniser workers and word memo, and alternates the two encoders' passes (``--pair-order``: which goes first;
    the order flips every round), so two settings meet the same host states; the second's numbers are under
    ``ARCH+pair``.
``onepath``
    ``bertflow evaluate --model-dir`` in bf16 against ``Embedder.encode``: a random-weight MiniLM-L6 with a
    whitening calibrator fitted on STS sentences, saved; the Spearman/Pearson scores of the evaluation path vs
    those computed from ``Embedder.load(folder).encode``, and the evaluation cache's vectors vs
    ``SentenceEncoder.encode`` (max abs difference).
``scaleout``
    ``bertflow distributed-encode`` under ``torchrun --nproc_per_node=1`` vs ``Embedder.encode`` on the same lines,
    same card, same calibrator (whitening): rows/s of each (the store job's own timed phase: barrier after the
    model load to barrier after the last shard, reading, tokenising, encoding, calibrating and writing
    included), and whether the store equals ``Embedder.encode``'s vectors. ``Embedder.encode`` is timed with its
    default chunking (the ratio) and with the store's chunk size; ``--baseline-src OTHER/src`` runs each round's job
    on that checkout too, interleaved (its rate, its ratio, and whether its store equals this one's).
``unpadded``
    The unpadded forward (``EncodeSettings(unpadded=True)``: encoding/packed.py) with each of ``--attentions``
    against the padded one (``unpadded=False``) in one process, per architecture: first pass of each (its own
    encoder, so its own tokeniser workers and word memo: the STS words are new to every one), then ``--rounds``
    warm passes each, interleaved; the largest 1 - cos of each one's vectors against the padded bf16 ones and
    against float32 padded.
``tests``
    The CUDA-only tests (and the rest of their files) under pytest on this machine: a dated record of the card,
    the commit (``--commit``) and every test's outcome.

    PYTHONPATH=src:benchmarks python3 benchmarks/gpu_checks.py throughput --tokenizer-dir TOK --data-dir STS
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness.common import interleave, sync

ARCHS = {
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "minilm-l6": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
}


def sts_pool(data_dir: Path) -> list[str]:
    """Distinct sentences of every ``*.tsv`` under the STS folder (``score, sentence1, sentence2`` rows)."""
    seen: dict[str, None] = {}
    for path in sorted(data_dir.rglob("*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            fields = line.split("\t")
            for s in fields[1:3] if len(fields) >= 3 else ():
                if s.strip():
                    seen.setdefault(s, None)
    return list(seen)


def random_model(arch: str, tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(seed)
    model = BertModel(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **ARCHS[arch]))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def card() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def synthetic(tokenizer_dir: Path, n: int, seed: int = 1) -> list[str]:
    """Sentences of 6-24 random whole words from the vocabulary (warm-up text that shares no sentence with STS)."""
    # An array, not a list: choice() would convert a list of ~20k words on every call (a minute for 20k sentences).
    words = np.array([w for w in (tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split() if w.isalpha()])
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=rng.integers(6, 25))) for _ in range(n)]


def setting_fields(spec: str) -> dict[str, Any]:
    """``"field=JSON,..."`` (``default``: none) -> ``{field: value}``, e.g. EncodeSettings keywords:
    ``"min_length_ratio=0,min_tokens=0"`` -> ``{"min_length_ratio": 0, "min_tokens": 0}``."""
    fields = {}
    for item in filter(None, spec.split(",")):
        if item != "default":
            key, _, value = item.partition("=")
            fields[key] = json.loads(value)
    return fields


#: Seconds the main thread has waited for the next prepared chunk (tokenised and batched by the pipeline's
#: threads), summed over the process: set by :func:`time_chunk_waits`, read by :func:`cpu_counters`.
CHUNK_WAIT = {"s": 0.0, "chunks": 0}


def time_chunk_waits() -> None:
    """Make every ``Prefetcher`` add the time its consumer (the main thread, which launches the kernels) waits for
    each chunk into :data:`CHUNK_WAIT`: a process whose main thread waits long is starved by the host side
    (tokenising, batching), one that does not is held up by the device or by the launches themselves."""
    from bertflow.encoding import batching

    untimed = batching.Prefetcher.__iter__

    def timed(self: Any) -> Any:
        it = untimed(self)
        while True:
            t = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                CHUNK_WAIT["s"] += time.perf_counter() - t
            CHUNK_WAIT["chunks"] += 1
            yield item

    batching.Prefetcher.__iter__ = timed  # type: ignore[method-assign]


FULL_COLLECTIONS = {"n": 0, "s": 0.0}


def time_full_collections() -> None:
    """Count Python's full collections (its oldest generation) in this process, on any thread, and their seconds
    into :data:`FULL_COLLECTIONS`: each walks every object the process holds (tens of ms with torch loaded)."""
    started: list[float] = []

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            FULL_COLLECTIONS["n"] += 1
            FULL_COLLECTIONS["s"] += time.perf_counter() - started.pop()

    gc.callbacks.append(on_collection)


def host_cpu_s() -> dict[str, float]:
    """Seconds of all the machine's cores so far (``/proc/stat``): busy (user, nice, system, irq, softirq), idle
    (with iowait) and stolen by the hypervisor (steal: a virtual machine's cores running someone else)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return {
        "host_busy_s": (user + nice + system + irq + softirq) / ticks,
        "host_idle_s": (idle + iowait) / ticks,
        "host_steal_s": steal / ticks,
    }


def cpu_counters(enc: Any) -> dict[str, Any]:
    """Linux counters of this process so far, to tell a slow process from a fast one (issue 23: whole processes ran at
    half speed): the main thread's CPU seconds (and their system part, with its minor page faults), voluntary
    (waiting) and involuntary (preempted by another thread or process) context switches and the seconds it waited
    for prepared chunks (:func:`time_chunk_waits`), the process's full collections and their seconds
    (:func:`time_full_collections`), the CPU seconds of the whole process (its pipeline threads included, ended ones
    too) and of each of the encoder's tokeniser worker processes (``enc.chunk_tokenizer.pool.pids``; summed over them
    also split into user and system seconds, with their minor page faults and involuntary context switches), the
    machine's cores (:func:`host_cpu_s`), and the cores the main thread may run on."""
    import resource

    main = resource.getrusage(resource.RUSAGE_THREAD)
    whole = resource.getrusage(resource.RUSAGE_SELF)
    pool = getattr(getattr(enc, "chunk_tokenizer", None), "pool", None)
    ticks = os.sysconf("SC_CLK_TCK")
    workers, split = [], np.zeros(4)
    for pid in getattr(pool, "pids", []):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{pid}/status").read_text()
            preempted = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            # utime, stime, minor page faults: the same work costing more user time means slower cores; more
            # system time or faults, the kernel's memory work; more preemptions, too many runnable threads.
            user, system, faults = int(fields[11]) / ticks, int(fields[12]) / ticks, int(fields[7])
        except (OSError, IndexError, ValueError):
            user = system = faults = preempted = 0
        workers.append(user + system)
        split += (user, system, faults, preempted)
    return {
        "main_cpu_s": main.ru_utime + main.ru_stime,
        "main_system_s": main.ru_stime,  # the kernel's share: page faults of fresh memory, for one
        "main_minor_faults": main.ru_minflt,
        "main_voluntary_switches": main.ru_nvcsw,
        "main_involuntary_switches": main.ru_nivcsw,
        "main_chunk_wait_s": CHUNK_WAIT["s"],
        "chunks": CHUNK_WAIT["chunks"],
        "full_collections": FULL_COLLECTIONS["n"],
        "full_collection_s": FULL_COLLECTIONS["s"],
        "process_cpu_s": whole.ru_utime + whole.ru_stime,
        "worker_cpu_s": sum(workers),
        "workers_cpu_s": workers,
        "worker_user_s": split[0],
        "worker_system_s": split[1],
        "worker_minor_faults": int(split[2]),
        "worker_preemptions": int(split[3]),
        **host_cpu_s(),
        "main_cores": len(os.sched_getaffinity(0)),
    }


def counter_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` for every counter (element-wise for lists) but ``main_cores`` (kept as it is), rounded."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        if k == "main_cores":
            out[k] = v
        elif isinstance(v, list):
            out[k] = [round(a - b, 3) for a, b in zip(v, before[k], strict=False)]
        else:
            out[k] = round(v - before[k], 4)
    return out


def make_encoder(args: argparse.Namespace, model: Path, settings: str) -> Any:
    """A ``SentenceEncoder`` of ``model`` (mean pooling, ``--device``) with ``settings`` (EncodeSettings fields,
    ``FIELD=JSON,...``; empty: the defaults) and ``--variant`` / ``--bucket`` applied (this checkout only)."""
    from bertflow import SentenceEncoder

    kwargs = {}
    if settings:  # e.g. min_length_ratio=0,min_tokens=0 (this checkout's fields)
        from bertflow.encoding.settings import EncodeSettings

        kwargs["settings"] = EncodeSettings(**setting_fields(settings))
    enc = SentenceEncoder(str(model), pooling="mean", device=args.device, **kwargs)
    if args.variant:  # ATTENTION:KERNELS of the unpadded forward instead of the defaults
        from bertflow.encoding.packed import ATTENTIONS

        attention, _, kernels = args.variant.partition(":")
        enc._runner.cuda_attention = ATTENTIONS[attention]
        if kernels:
            enc._runner.packed.kernels = kernels
    if args.bucket:  # tokens the packed layout grows each batch to a multiple of
        enc._runner.token_bucket = args.bucket
    return enc


@contextlib.contextmanager
def observe(
    sides: dict[str, Any],
    counters: dict[str, list[dict[str, Any]]] | None,
    windows: dict[str, list[tuple[float, float]]],
    name: str,
) -> Iterator[None]:
    """Around one timed pass of ``sides[name]`` (outside its timing): the window the ruler's median is taken over,
    into ``windows[name]``, and the pass's :func:`cpu_counters` deltas into ``counters[name]`` (``None``: none)."""
    before = cpu_counters(sides[name]) if counters is not None else None
    start = time.perf_counter()
    yield
    windows.setdefault(name, []).append((start, time.perf_counter()))
    if counters is not None:
        counters[name].append(counter_deltas(before, cpu_counters(sides[name])))


def throughput(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import bertflow

    pool = sts_pool(args.data_dir)
    rng = np.random.default_rng(0)
    text = [pool[i] for i in rng.permutation(np.arange(args.sentences) % len(pool))]
    warm = synthetic(args.tokenizer_dir, args.warmup)
    out: dict[str, Any] = {"bertflow": bertflow.__version__, "file": bertflow.__file__, "card": card(), "runs": {}}
    out["variant"] = args.variant or "defaults"
    out["settings"] = args.settings or "defaults"
    out["pair"] = args.pair or None
    out["bucket"] = args.bucket or "default"
    out["warmup_sentences"] = args.warmup
    if args.counters:
        time_chunk_waits()
        time_full_collections()
    ruler = None
    if args.ruler:  # the host's own speed during each pass (harness/ruler.py)
        from harness.ruler import Ruler

        ruler = Ruler(work / "ruler.bin")
    windows: dict[str, list[tuple[float, float]]] = {}
    for arch in args.archs.split(","):
        model = random_model(arch, args.tokenizer_dir, work / arch)
        # Each side of a pair has its own encoder, so its own tokeniser workers and word memo: the timed text is new
        # to both at their first pass. Their passes alternate (the order flips every round), so both see the same
        # states of the host, which can run the same work at two speeds (docs/performance.md, eleventh pass).
        sides = {arch: make_encoder(args, model, args.settings)}
        if args.pair:
            sides[f"{arch}+pair"] = make_encoder(args, model, args.pair)
        for enc in sides.values():
            enc.encode(warm, show_progress_bar=False)  # CUDA and allocator warm-up on text unlike the timed text
        counters: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        order = list(sides) if args.pair_order == "ab" else list(sides)[::-1]
        passes = {name: functools.partial(sides[name].encode, text, show_progress_bar=False) for name in order}
        observed = functools.partial(observe, sides, counters if args.counters else None, windows)
        rates = {
            name: [len(text) / t for t in ts] for name, ts in interleave(passes, 1 + args.rounds, observed).items()
        }
        for name in sides:
            out["runs"][name] = {
                # The process's first pass over the STS words (the tokeniser's word memo is cold for them).
                "first_pass_sentences_per_s": round(rates[name][0]),
                "warm_sentences_per_s": round(statistics.median(rates[name][1:])),
                "rounds": [round(x) for x in rates[name]],
                **({"settings": args.pair} if name.endswith("+pair") else {}),
                **({"counters": counters[name]} if args.counters else {}),
            }
        for enc in sides.values():
            getattr(enc, "close", lambda: None)()  # its tokeniser workers (an older checkout may lack close)
        del sides, enc, passes
        torch.cuda.empty_cache()
    if ruler is not None:
        ruler.stop()  # it writes its last repetitions before it exits
        # The ruler's median repetition (ms) during each pass, and over the whole run, to compare passes made
        # in the same state of the host (on issue 23's machines: 0.50-0.55 ms or 0.80-0.97 ms).
        out["ruler_ms_whole_run"] = ruler.median_ms()
        for arch, spans in windows.items():
            out["runs"][arch]["ruler_ms"] = [ruler.median_ms(a, b) for a, b in spans]
    return out


def onepath(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator
    from bertflow.evaluation.cache import EmbeddingCache, embed_cached
    from bertflow.evaluation.datasets import load_sts_task
    from bertflow.evaluation.sts import evaluate_task
    from bertflow.paper.grid import evaluate_embedder

    model = random_model("minilm-l6", args.tokenizer_dir, work / "minilm")
    enc = SentenceEncoder(str(model), pooling="mean", device=args.device)  # dtype auto: bf16 on CUDA
    task = load_sts_task("STS-B", args.data_dir)
    emb = Embedder(enc, WhiteningCalibrator()).fit(task.fit_sentences("train"))
    emb.save(work / "model")
    loaded = Embedder.load(work / "model", device=args.device)
    grid = evaluate_embedder(loaded, task_names=["STS-B"], data_dir=args.data_dir, cache=EmbeddingCache(work / "cache"))
    cell = grid.to_dict()["cells"][-1]["tasks"]["STS-B"]
    mine = evaluate_task(task, loaded.encode)
    sentences = task.eval_sentences()
    cached = embed_cached(loaded.encoder, sentences, ["mean"], cache=EmbeddingCache(work / "cache"))["mean"]
    direct = loaded.encoder.encode(sentences, show_progress_bar=False)
    return {
        "card": card(),
        "dtype": str(loaded.encoder.dtype),
        "evaluate_all_spearman": cell["all"]["mean"],
        "encode_all_spearman": mine.all_spearman,
        "evaluate_pearson": cell["pearson"]["all"]["mean"],
        "encode_pearson": mine.all_pearson,
        "max_abs_score_diff_x100": max(
            abs(cell["all"]["mean"] - mine.all_spearman), abs(cell["pearson"]["all"]["mean"] - mine.all_pearson)
        ),
        "cache_vs_encode_max_abs": float(np.abs(np.asarray(cached) - direct).max()),
    }


def scaleout(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator
    from bertflow.scale.reader import open_embeddings

    model = random_model(args.scale_arch, args.tokenizer_dir, work / "model")
    pool = sts_pool(args.data_dir)
    lines = [pool[i % len(pool)] for i in range(args.rows)]
    text = work / "input.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    enc = SentenceEncoder(str(model), pooling="mean", device=args.device)
    emb = Embedder(enc, WhiteningCalibrator()).fit(pool[:20000])
    emb.save(work / "fitted")
    emb.encode(lines[:50000], show_progress_bar=False)  # warm-up
    times = []
    for _ in range(args.rounds):
        sync()
        t = time.perf_counter()
        ref = emb.encode(lines, show_progress_bar=False)
        sync()
        times.append(time.perf_counter() - t)
    embedder_rate = args.rows / statistics.median(times)
    # The store's forward passes hold chunk_size sentences each; Embedder.encode with the same chunking must give
    # the store bit for bit (the default Embedder.encode ramps its first chunks up from 4,096 on CUDA).
    import dataclasses

    emb.encoder.settings = dataclasses.replace(emb.encoder.settings, chunk_size=args.chunk_size)
    same_chunks = emb.encode(lines, show_progress_bar=False)
    same_times = []
    for _ in range(args.rounds):
        sync()
        t = time.perf_counter()
        emb.encode(lines, show_progress_bar=False)
        sync()
        same_times.append(time.perf_counter() - t)
    jobs = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.omp_threads:  # torchrun sets OMP_NUM_THREADS=1 in every rank unless it is set already
        env["OMP_NUM_THREADS"] = str(args.omp_threads)
    # --baseline-src: every round also runs the job on another checkout's src (interleaved, same input and model)
    variants = [("new", env)]
    if args.baseline_src:
        here = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        own = [p for p in here if (Path(p) / "bertflow").is_dir()]
        rest = [p for p in here if p not in own]
        variants.append(("baseline", {**env, "PYTHONPATH": os.pathsep.join([str(args.baseline_src.resolve()), *rest])}))
    for r, (name, job_env) in ((r, v) for r in range(args.rounds) for v in variants):
        out = work / (f"store{r}" if name == "new" else f"baseline{r}")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "bertflow",
            "distributed-encode",
            str(text),
            "--model-dir",
            str(work / "fitted"),
            "-o",
            str(out),
            "--overwrite",
            "-q",
            "--chunk-size",
            str(args.chunk_size),
            "--shard-size",
            str(args.shard_size),
            *(["--device", "cpu"] if args.device == "cpu" else []),
        ]
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=job_env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:], "cmd": " ".join(cmd), "code": name}
        summary = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
        jobs.append({"code": name, "wall_s": round(wall, 2), "summary": summary})
    store = np.asarray(open_embeddings(work / "store0"))

    def median_rate(code: str) -> float | None:
        rates = [j["summary"]["rows_per_second"] for j in jobs if j["code"] == code and j["summary"]["rows_per_second"]]
        return statistics.median(rates) if rates else None

    store_rate = median_rate("new")
    same_rate = args.rows / statistics.median(same_times)
    baseline: dict[str, Any] = {}
    if args.baseline_src:
        base_rate = median_rate("baseline")
        baseline = {
            "baseline_src": str(args.baseline_src),
            "baseline_distributed_encode_rows_per_s": round(base_rate) if base_rate else None,
            "baseline_ratio_distributed_over_embedder": round(base_rate / embedder_rate, 4) if base_rate else None,
            "store_equals_baseline_store": bool(np.array_equal(store, np.asarray(open_embeddings(work / "baseline0")))),
        }
    return {
        "card": card(),
        "arch": args.scale_arch,
        "rows": args.rows,
        "embedder_encode_rows_per_s": round(embedder_rate),
        "embedder_encode_seconds": [round(t, 3) for t in times],
        "distributed_encode_rows_per_s": round(store_rate) if store_rate else None,
        "ratio_distributed_over_embedder": round(store_rate / embedder_rate, 4) if store_rate else None,
        "embedder_encode_same_chunks_rows_per_s": round(same_rate),
        "ratio_distributed_over_embedder_same_chunks": round(store_rate / same_rate, 4) if store_rate else None,
        **baseline,
        "jobs": jobs,
        "chunk_size": args.chunk_size,
        "omp_threads": args.omp_threads or "unset (torchrun: 1)",
        "store_equals_embedder_encode_same_chunks": bool(np.array_equal(store, same_chunks)),
        "store_max_abs_diff_vs_default_embedder_encode": float(np.abs(store - ref).max()),
    }


def streams(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Where the scale-out path loses time, one process, no torchrun: Embedder.encode on a list vs the streaming
    loop (iter_calibrated) on the same list, on a generator, and writing shards as distributed-encode does."""
    from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator
    from bertflow.embedder import iter_calibrated
    from bertflow.scale.layout import ShardSpec
    from bertflow.scale.shards import open_shard_writer

    model = random_model(args.scale_arch, args.tokenizer_dir, work / "model")
    pool = sts_pool(args.data_dir)
    lines = [pool[i % len(pool)] for i in range(args.rows)]
    enc = SentenceEncoder(str(model), pooling="mean", device=args.device)
    emb = Embedder(enc, WhiteningCalibrator()).fit(pool[:20000])
    dim = emb.encode(lines[:10]).shape[1]

    def write_shards() -> None:
        stream = iter_calibrated(enc, emb.calibrator, iter(lines), chunk_size=args.chunk_size)
        for k, start in enumerate(range(0, len(lines), args.shard_size)):
            rows = min(args.shard_size, len(lines) - start)
            spec = ShardSpec(index=k, start=start, stop=start + rows, offset=0)
            with open_shard_writer(work, spec, dim) as writer:
                need = rows
                while need:
                    part = next(stream)
                    writer.write(part)
                    need -= len(part)
                writer.commit()

    runs = {
        "embedder_encode_list": lambda: emb.encode(lines, show_progress_bar=False),
        "iter_calibrated_list": lambda: list(iter_calibrated(enc, emb.calibrator, lines, chunk_size=args.chunk_size)),
        "iter_calibrated_generator": lambda: list(
            iter_calibrated(enc, emb.calibrator, iter(lines), chunk_size=args.chunk_size)
        ),
        "iter_calibrated_write_shards": write_shards,
    }
    runs["embedder_encode_list"]()  # warm-up
    out: dict[str, Any] = {"card": card(), "rows": args.rows, "chunk_size": args.chunk_size, "rows_per_s": {}}
    for name, fn in runs.items():
        times = []
        for _ in range(args.rounds):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        out["rows_per_s"][name] = round(args.rows / statistics.median(times))
    return out


def cosine_gap(a: np.ndarray, b: np.ndarray) -> float:
    """Largest 1 - cos(a_i, b_i) over rows (float64)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float((1 - cos).max())


def unpadded(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import dataclasses

    import bertflow
    from bertflow import SentenceEncoder
    from bertflow.encoding.packed import ATTENTIONS
    from bertflow.encoding.settings import EncodeSettings

    pool = sts_pool(args.data_dir)
    rng = np.random.default_rng(0)
    text = [pool[i] for i in rng.permutation(np.arange(args.sentences) % len(pool))]
    warm = synthetic(args.tokenizer_dir, 20000)
    out: dict[str, Any] = {"bertflow": bertflow.__version__, "card": card(), "torch": torch.__version__, "runs": {}}
    variants = ["padded", *(a if a.startswith("padded") else f"unpadded-{a}" for a in args.attentions.split(","))]
    for arch in args.archs.split(","):
        model = random_model(arch, args.tokenizer_dir, work / arch)
        encs = {}
        for name in variants:
            spec, _, budget = name.partition("@")
            flag = spec != "padded"
            settings = EncodeSettings(unpadded=flag, max_tokens=int(budget) if budget else None)
            enc = SentenceEncoder(str(model), pooling="mean", device=args.device, settings=settings)
            if flag:  # unpadded-ATTENTION[:KERNELS]
                attention, _, kernels = spec.split("-", 1)[1].partition(":")
                enc._runner.cuda_attention = ATTENTIONS[attention]
                if kernels and enc._runner.packed is not None:
                    enc._runner.packed.kernels = kernels
            enc.encode(warm, show_progress_bar=False)
            encs[name] = enc
        vectors: dict[str, np.ndarray] = {}

        def encode(name: str, encs: dict[str, Any] = encs, vectors: dict[str, np.ndarray] = vectors) -> None:
            vectors[name] = encs[name].encode(text, show_progress_bar=False)

        # Every variant's first pass, then warm rounds in alternating order.
        passes = {name: functools.partial(encode, name) for name in variants}
        rates = {name: [len(text) / t for t in ts] for name, ts in interleave(passes, 1 + args.rounds).items()}
        ref32 = SentenceEncoder(str(model), pooling="mean", device=args.device, dtype="float32")
        ref32.settings = dataclasses.replace(ref32.settings, unpadded=False)
        v32 = ref32.encode(text[:4096], show_progress_bar=False)
        run: dict[str, Any] = {"padding_efficiency": encs["padded"].last_stats.padding_efficiency}
        for name in variants:
            run[name] = {
                "first_pass_sentences_per_s": round(rates[name][0]),
                "warm_sentences_per_s": round(statistics.median(rates[name][1:])),
                "rounds": [round(x) for x in rates[name]],
                "max_1_minus_cos_vs_padded_bf16": cosine_gap(vectors[name], vectors["padded"]),
                "max_1_minus_cos_vs_fp32_padded": cosine_gap(vectors[name][:4096], v32),
            }
            for key in ("first_pass_sentences_per_s", "warm_sentences_per_s"):
                run[name][f"ratio_{key}"] = round(run[name][key] / run["padded"][key], 3)
        out["runs"][arch] = run
        print(json.dumps({arch: run}), flush=True)
        for enc in (*encs.values(), ref32):
            enc.close()
        del encs, ref32
        torch.cuda.empty_cache()
    return out


CUDA_TEST_FILES = (
    "tests/encoding/test_packed.py",
    "tests/encoding/test_graphs.py",
    "tests/test_cuda_graphs.py",
    "tests/encoding/test_fused.py",
    "tests/encoding/test_triton_kernels.py",
    "tests/encoding/test_warmup.py",
    "tests/encoding/test_tokenization.py",
    "tests/encoding/test_wordpiece.py",
    "tests/encoding/test_tokenizer_pool.py",
    "tests/encoding/test_stream.py",
    "tests/calibrators/test_device.py",
    "tests/calibrators/test_flow.py",
    "tests/benchmarks/test_harness.py",
)


def cuda_tests(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run the files holding CUDA-only tests (``-m "not slow"``) and record every test's outcome."""
    import datetime
    import xml.etree.ElementTree as ET

    report = work / "junit.xml"
    files = args.test_files.split(",") if args.test_files else list(CUDA_TEST_FILES)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", f"--junitxml={report}"]
    proc = subprocess.run([*cmd, *files], capture_output=True, text=True)
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        outcomes[name] = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failure", "error", "skipped")}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "card": card(),
        "commit": args.commit,
        "torch": torch.__version__,
        "command": " ".join([*cmd, *files]),
        "exit_status": proc.returncode,
        "counts": counts,
        "not_passed": {k: v for k, v in outcomes.items() if v != "passed"},
        "tests": outcomes,
        "tail": proc.stdout[-2000:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["throughput", "onepath", "scaleout", "streams", "unpadded", "tests"])
    parser.add_argument("--tokenizer-dir", type=Path, default=None, help="required except for tests")
    parser.add_argument("--data-dir", type=Path, default=None, help="required except for tests")
    parser.add_argument(
        "--attentions",
        default="slotted,segments",
        help="unpadded: variants to compare with the padded forward, ATTENTION[:KERNELS][@MAX_TOKENS] "
        "(e.g. segments:fused@131072; no kernels: the CUDA default) or padded@MAX_TOKENS",
    )
    parser.add_argument("--variant", default="", help="throughput: unpadded ATTENTION:KERNELS (default: defaults)")
    parser.add_argument(
        "--warmup", type=int, default=20000, help="throughput: random-word sentences encoded before the timed passes"
    )
    parser.add_argument("--bucket", type=int, default=0, help="throughput: the packed layout's token bucket")
    parser.add_argument("--settings", default="", help="throughput: EncodeSettings fields, FIELD=JSON,...")
    parser.add_argument(
        "--pair",
        default="",
        help="throughput: a second encoder in the same process with these EncodeSettings fields ('default': none), "
        "its passes alternating with the first's; its numbers are under ARCH+pair",
    )
    parser.add_argument(
        "--pair-order", choices=["ab", "ba"], default="ab", help="throughput: which side of a pair runs first"
    )
    parser.add_argument(
        "--counters", action="store_true", help="throughput: each pass's CPU counters (Linux; see cpu_counters)"
    )
    parser.add_argument(
        "--ruler",
        action="store_true",
        help="throughput: a ruler process beside the passes, each pass's host speed (benchmarks/harness/ruler.py)",
    )
    parser.add_argument("--commit", default="unknown", help="tests: the commit under test, for the record")
    parser.add_argument("--test-files", default="", help="tests: comma-separated files (default: CUDA_TEST_FILES)")
    parser.add_argument("--archs", default="bert-base,minilm-l6")
    parser.add_argument("--sentences", type=int, default=40000, help="throughput: sentences per timed pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200_000, help="scaleout: lines in the input file")
    parser.add_argument("--scale-arch", default="bert-base")
    parser.add_argument("--chunk-size", type=int, default=16384, help="scaleout: distributed-encode --chunk-size")
    parser.add_argument("--omp-threads", type=int, default=0, help="scaleout: OMP_NUM_THREADS for torchrun (0: unset)")
    parser.add_argument("--shard-size", type=int, default=131072, help="scaleout: distributed-encode --shard-size")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="scaleout: also run every round's job on this src folder (another checkout), interleaved",
    )
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test the script")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.what != "tests" and (args.tokenizer_dir is None or args.data_dir is None):
        parser.error(f"{args.what} needs --tokenizer-dir and --data-dir")
    with tempfile.TemporaryDirectory(prefix="bertflow-gpu-") as tmp:
        modes = {"throughput": throughput, "onepath": onepath, "scaleout": scaleout, "streams": streams}
        modes.update(unpadded=unpadded, tests=cuda_tests)
        result = modes[args.what](args, Path(tmp))
    result["command"] = " ".join(sys.argv)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
