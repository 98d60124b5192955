"""Run a benchmark script (``python no_prefault_run.py SCRIPT ARGS...``) with ``EncodeSettings.prefault`` off
everywhere, i.e. the library as it was before the fifteenth pass, for side-by-side runs of scripts that take no
settings (call g: ``calibrator_overhead_gpu.py``)."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "src")]

from bertflow.encoding.settings import EncodeSettings  # noqa: E402

EncodeSettings.prefaults = lambda self, device_type: False  # type: ignore[method-assign]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
