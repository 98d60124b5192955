"""Memory of ``bertflow encode`` on a large file: peak resident memory of the process and of its tokenisation
workers, polled from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["bench_memory"]

#: What ``bertflow encode FILE -o OUT --model M --device D`` does (cli/core.py), for machines without typer.
_STREAM_SCRIPT = """
import json, sys
import numpy as np
from bertflow import Embedder, SentenceEncoder
from bertflow.calibrators import IdentityCalibrator
from bertflow.io.text import iter_lines
path, out, model, device = sys.argv[1:5]
embedder = Embedder(SentenceEncoder(model or None, device=device or None), IdentityCalibrator())
texts = [text for _, text in iter_lines(path)]
arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(len(texts), embedder.encoder.dim))
row = 0
for part in embedder.iter_encode(texts, batch_size=128, show_progress_bar=False):
    arr[row : row + len(part)] = part
    row += len(part)
arr.flush()
print(json.dumps({"output": out, "rows": len(texts), "dim": embedder.encoder.dim}))
"""


def _children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (the tokenisation workers of an encoder), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _pss_kb(pid: int) -> int:
    """Proportional set size of a process (kB): its private pages plus its share of pages it shares."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _watch_memory(pid: int, stop: threading.Event, peak: dict[str, int]) -> None:
    """Poll /proc/PID/status for resident memory (kB), keeping the maxima: anonymous, file-backed, total; and the
    summed proportional set size of its child processes (forked workers share most pages with their parent)."""
    keys = {
        "RssAnon:": "anon_kb",
        "RssFile:": "file_kb",
        "RssShmem:": "shmem_kb",
        "VmRSS:": "rss_kb",
        "VmHWM:": "hwm_kb",
        "VmPin:": "pinned_kb",
        "VmLck:": "locked_kb",
    }
    polls = 0
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    parts = line.split()
                    if parts and parts[0] in keys:
                        name = keys[parts[0]]
                        peak[name] = max(peak.get(name, 0), int(parts[1]))
        except (FileNotFoundError, ProcessLookupError):
            return
        if polls % 5 == 0:  # smaps_rollup walks page tables: every 250 ms is enough
            children = _children(pid)
            peak["workers"] = max(peak.get("workers", 0), len(children))
            peak["workers_pss_kb"] = max(peak.get("workers_pss_kb", 0), sum(map(_pss_kb, children)))
        polls += 1
        stop.wait(0.05)


def bench_memory(
    lines: int,
    model: str | None,
    workdir: str | Path,
    *,
    source: Sequence[str],
    device: str | None = None,
    extra_args: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``bertflow encode`` on a generated ``lines``-line file in a subprocess; report its peak memory.

    Peak RSS is the child's own high-water mark (``VmHWM``) and its split into anonymous memory (what the
    process allocated), file-backed pages (libraries, and the output .npy memory map: page cache the kernel
    can drop) and shared/pinned memory, all polled from ``/proc/PID/status`` every 50 ms.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    text = workdir / f"lines-{lines}.txt"
    out = workdir / f"lines-{lines}.npy"
    with text.open("w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(source[i % len(source)] + "\n")
    import importlib.util

    if importlib.util.find_spec("typer") is not None:
        runner = "bertflow encode (CLI)"
        cmd = [sys.executable, "-m", "bertflow", "encode", str(text), "-o", str(out), "--quiet"]
        if model:
            cmd += ["--model", model]
        if device:
            cmd += ["--device", device]
        cmd += list(extra_args)
    else:  # no typer (a bare GPU image): the same streaming loop as the CLI's encode command
        runner = "the CLI's encode loop as a script (typer missing)"
        cmd = [sys.executable, "-c", _STREAM_SCRIPT, str(text), str(out), model or "", device or ""]
    import bertflow

    env = dict(os.environ)
    src = str(Path(bertflow.__file__).resolve().parents[1])  # the child runs the bertflow this process imported
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    with open(workdir / "stdout.txt", "w+") as out_f, open(workdir / "stderr.txt", "w+") as err_f:
        proc = subprocess.Popen(cmd, env=env, stdout=out_f, stderr=err_f, text=True)
        peak: dict[str, int] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_memory, args=(proc.pid, stop, peak), daemon=True)
        watcher.start()
        # wait4 gives this child's own peak RSS (ru_maxrss, kB on Linux), unlike RUSAGE_CHILDREN's running max.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        watcher.join()
        seconds = time.perf_counter() - start
        out_f.seek(0)
        err_f.seek(0)
        stdout, stderr = out_f.read(), err_f.read()
    if proc.returncode != 0:
        raise RuntimeError(f"bertflow encode failed ({proc.returncode}): {stderr[-2000:]}")
    result = {
        "lines": lines,
        "runner": runner,
        "command": " ".join(cmd) if runner.startswith("bertflow") else runner,
        "seconds": seconds,
        "lines_per_s": lines / seconds,
        # The process's own peak (VmHWM, last read before it exited). wait4's ru_maxrss also counts the moments
        # between fork and exec, when the child is a copy of this (large) benchmark process.
        "peak_rss_mb": peak.get("hwm_kb", 0) / 1024,
        "ru_maxrss_mb": usage.ru_maxrss / 1024,
        "peak_anon_mb": peak.get("anon_kb", 0) / 1024,
        "peak_file_mb": peak.get("file_kb", 0) / 1024,
        "peak_shmem_mb": peak.get("shmem_kb", 0) / 1024,
        "peak_pinned_mb": max(peak.get("pinned_kb", 0), peak.get("locked_kb", 0)) / 1024,
        "worker_processes": peak.get("workers", 0),
        "peak_workers_pss_mb": peak.get("workers_pss_kb", 0) / 1024,
        "output_mb": out.stat().st_size / 2**20,
        "stdout": stdout.strip()[-500:],
    }
    log(
        f"[memory] bertflow encode {lines:,} lines: {seconds:.1f} s, peak RSS {result['peak_rss_mb']:.0f} MB "
        f"(anonymous {result['peak_anon_mb']:.0f} MB, file-backed {result['peak_file_mb']:.0f} MB, shared "
        f"{result['peak_shmem_mb']:.0f} MB, pinned {result['peak_pinned_mb']:.0f} MB; "
        f"{result['worker_processes']} tokenisation workers, {result['peak_workers_pss_mb']:.0f} MB PSS together; "
        f"output {result['output_mb']:.0f} MB)"
    )
    text.unlink()
    out.unlink()
    return result
