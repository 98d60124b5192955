"""Issue 23, thirteenth pass: ``gpu_checks.py`` with another thread switch interval while the chunk pipeline runs
(``batching.FAST_SWITCH_INTERVAL``, 0.5 ms in the library):

    python switch_variant.py SECONDS throughput --tokenizer-dir ...   # the rest: gpu_checks.py's arguments
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]

if __name__ == "__main__":
    from bertflow.encoding import batching

    batching.FAST_SWITCH_INTERVAL = float(sys.argv[1])
    sys.argv = [str(HERE.parents[3] / "benchmarks" / "gpu_checks.py"), *sys.argv[2:]]
    import gpu_checks

    gpu_checks.main()
