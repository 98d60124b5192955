"""The benchmark harness lives in ``benchmarks/`` beside the package; its scripts import it as ``harness`` (they run
with ``benchmarks/`` first on ``sys.path``), and so do these tests."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
