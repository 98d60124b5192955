"""Issue 23, fifteenth pass, call d: ``gpu_checks.py throughput --pair SETTINGS`` with the pair's encoder as it was
before this pass, i.e. without the result written on a thread before the first chunk (``SentenceEncoder.encode``
then faults the result's pages in on the main thread, in each chunk's copy from the device), the other encoder as the
library is now. Pass settings equal to the defaults, so this is the only difference between the sides.

    python no_prefault_variant.py throughput --pair first_chunk=4096 --tokenizer-dir ...   # the rest: gpu_checks.py's
    python no_prefault_variant.py --check MODEL_DIR   # on CPU: both sides give the same vectors
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fourteenth_pass_1xGPU"))
import pair_variant  # noqa: E402  (puts src/ and benchmarks/ on sys.path)


class _NoFill:
    """``threading`` whose ``Thread`` never runs its target: the encoder's pre-fault thread does nothing."""

    class Thread:
        started = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def start(self) -> None:
            _NoFill.Thread.started += 1

        def join(self, timeout: float | None = None) -> None:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def without_prefault(enc: Any) -> Any:
    """``enc`` with an ``encode`` that skips the library's pre-fault (the result is left unwritten until the copies)."""
    from bertflow.encoding import encoder as module

    encode = enc.encode

    def encode_plain(sentences: Any, **kwargs: Any) -> Any:
        module.threading = _NoFill()
        try:
            return encode(sentences, **kwargs)
        finally:
            module.threading = threading

    enc.encode = encode_plain
    return enc


if __name__ == "__main__" and sys.argv[1] == "--check":
    import numpy as np

    from bertflow import SentenceEncoder

    text = [f"sentence number {i} of the check, with some words" for i in range(3000)]
    plain = SentenceEncoder(sys.argv[2], pooling="mean").encode(text, show_progress_bar=False)
    other = without_prefault(SentenceEncoder(sys.argv[2], pooling="mean")).encode(text, show_progress_bar=False)
    print("same vectors:", np.array_equal(plain, other), "skipped pre-faults:", _NoFill.Thread.started)
elif __name__ == "__main__":
    pair_variant.run(without_prefault)
