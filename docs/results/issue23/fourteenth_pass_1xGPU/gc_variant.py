"""Issue 23, fourteenth pass: ``gpu_checks.py throughput --pair SETTINGS`` with the pair's encoder running the code
before the change (full collections not deferred while the chunk pipeline runs: ``batching.DEFER_FULL_COLLECTIONS``
off during its passes) and the other encoder the library as it is. Pass settings equal to the defaults, so the
deferral is the only difference between the two sides:

    python gc_variant.py throughput --pair first_chunk=4096 --tokenizer-dir ...   # the rest: gpu_checks.py's
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[3] / "benchmarks"), str(HERE.parents[3] / "src")]

if __name__ == "__main__":
    from bertflow.encoding import batching

    sys.argv = [str(HERE.parents[3] / "benchmarks" / "gpu_checks.py"), *sys.argv[1:]]
    import gpu_checks

    pair = sys.argv[sys.argv.index("--pair") + 1]
    make = gpu_checks.make_encoder

    def make_encoder(args: Any, model: Path, settings: str) -> Any:
        enc = make(args, model, settings)
        if settings == pair:
            encode = enc.encode

            def encode_without_deferral(*a: Any, **k: Any) -> Any:
                batching.DEFER_FULL_COLLECTIONS = False
                try:
                    return encode(*a, **k)
                finally:
                    batching.DEFER_FULL_COLLECTIONS = True

            enc.encode = encode_without_deferral
        return enc

    gpu_checks.make_encoder = make_encoder
    gpu_checks.main()
