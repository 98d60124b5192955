"""The host's own speed beside a benchmark: a "ruler" process that repeats one fixed piece of single-threaded Python
for as long as the benchmark runs and records how long each repetition took.

Why: on the GPU machines of issue 23 the same work ran up to twice as slowly for seconds to minutes at a time, with
no time stolen by the hypervisor and no load of ours behind it; the ruler took either 0.50-0.55 ms or 0.80-0.97 ms a
repetition, and the encoder's passes followed it (docs/performance.md, eleventh pass). A pass timed beside the
ruler says which state the host was in, so that two variants are compared in the same state.

The ruler takes one core: on a machine with few cores it slows what it measures (fine on a 16-core GPU host).
The ruler's clock is ``time.perf_counter`` (CLOCK_MONOTONIC on Linux, the same in every process), so a pass timed
with it in the benchmark's own process is placed on the ruler's record directly.
"""

from __future__ import annotations

import statistics
import struct
import subprocess
import sys
from pathlib import Path

#: The ruler process: a fixed loop, each repetition's (start, seconds) appended to the file named by its argument
#: every 50 ms and when it is terminated. SIGTERM only ends the loop, which then writes what is left: a handler that
#: wrote the buffer itself could run between a periodic write and the buffer's clearing, and write marks twice.
RULER_SCRIPT = r"""
import signal, struct, sys, time
out = open(sys.argv[1], "ab", buffering=0)
buf = bytearray()
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
flush = time.perf_counter() + 0.05
while not stopping:
    t = time.perf_counter()
    s = 0
    for i in range(10000):
        s += i * i
    now = time.perf_counter()
    buf += struct.pack("dd", t, now - t)
    if now >= flush:
        out.write(bytes(buf))
        buf.clear()
        flush = now + 0.05
out.write(bytes(buf))
"""

_MARK = struct.Struct("dd")


class Ruler:
    """Runs the ruler process from construction to :meth:`stop` (or the end of a ``with`` block), writing to
    ``path`` (a new file: FileExistsError if one is there); :meth:`median_ms` reads the record back."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.open("xb").close()  # a new file: never writes over one that is there
        except FileExistsError:
            raise FileExistsError(f"{self.path} exists; the ruler writes a new file") from None
        self.process = subprocess.Popen([sys.executable, "-c", RULER_SCRIPT, str(self.path)])

    def stop(self) -> None:
        """End the ruler process (its last repetitions are written first); safe to call twice."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def marks(self) -> list[tuple[float, float]]:
        """Every repetition recorded so far: ``(start, seconds)``, ``start`` on ``time.perf_counter``'s clock."""
        data = self.path.read_bytes()
        return list(_MARK.iter_unpack(data[: len(data) - len(data) % _MARK.size]))

    def median_ms(self, start: float | None = None, end: float | None = None) -> float | None:
        """The median repetition in milliseconds of those that started between ``start`` and ``end`` (perf_counter
        seconds; ``None``: no bound), or ``None`` if none did."""
        inside = [dt for t, dt in self.marks() if (start is None or t >= start) and (end is None or t <= end)]
        return round(statistics.median(inside) * 1e3, 4) if inside else None

    def __enter__(self) -> Ruler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
