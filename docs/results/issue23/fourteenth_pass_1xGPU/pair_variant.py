"""What the variant probes of this folder share: ``gpu_checks.py`` run with one change applied to the encoder of
``--pair`` (built with the pair's settings; pass settings equal to the defaults, so the change is the only
difference between the two sides). Also puts ``benchmarks/`` and ``src/`` first on ``sys.path``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "src")]


def run(change: Callable[[Any], Any]) -> None:
    """``gpu_checks.main()`` on this process's arguments, with ``change(encoder)`` applied to the pair's encoder."""
    sys.argv = [str(ROOT / "benchmarks" / "gpu_checks.py"), *sys.argv[1:]]
    import gpu_checks

    pair = sys.argv[sys.argv.index("--pair") + 1]
    make = gpu_checks.make_encoder

    def make_encoder(args: Any, model: Path, settings: str) -> Any:
        enc = make(args, model, settings)
        return change(enc) if settings == pair else enc

    gpu_checks.make_encoder = make_encoder
    gpu_checks.main()
