"""Issue 23, for the next call: ``gpu_checks.py throughput --pair SETTINGS`` with the pair's encoder writing its
result into memory that a background thread page-faulted while the first chunk was being tokenised, the other
encoder as the library is. Pass settings equal to the defaults, so this is the only difference between the sides.

Why: ``SentenceEncoder.encode`` allocates its result (40,000 x 384 float32, 61 MB, for MiniLM-L6) when the first
chunk arrives, and each chunk's copy from the device then writes fresh pages, faulting them in on the main thread
(on the 2-core VM: 80 ms for the first write of such an array, 5.5 ms for the next; ``gc_probe.py``'s neighbour
``fault_probe.py``). numpy's ``fill`` releases the GIL, so another thread can take those faults while the main
thread waits for its first chunk. Here the pair's ``encode`` allocates the result at once and fills it on a thread;
the encoder's ``np.empty`` of that shape returns it after the thread ends (no chunk is written before).

    python prefault_variant.py throughput --pair first_chunk=4096 --tokenizer-dir ...   # the rest: gpu_checks.py's
    python prefault_variant.py --check MODEL_DIR   # on CPU: both sides give the same vectors
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import pair_variant  # puts src/ and benchmarks/ on sys.path


class Prefaulted:
    """numpy, except that ``empty(shape, float32)`` returns a buffer of ``shape`` page-faulted on a thread."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.buffer = np.empty(shape, np.float32)
        self.thread = threading.Thread(target=self.buffer.fill, args=(0.0,), name="prefault")
        self.thread.start()

    def empty(self, shape: Any, dtype: Any = float, **kwargs: Any) -> np.ndarray:
        if tuple(shape) == self.shape and np.dtype(dtype) == np.float32:
            self.thread.join()
            return self.buffer
        return np.empty(shape, dtype=dtype, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


def prefaulting(enc: Any) -> Any:
    """``enc`` with an ``encode`` whose result is :class:`Prefaulted` (one pooling, no transform)."""
    from bertflow.encoding import encoder as module

    encode = enc.encode

    def encode_prefaulted(sentences: Any, **kwargs: Any) -> Any:
        shim = Prefaulted((len(sentences), enc.dim))
        module.np = shim
        try:
            return encode(sentences, **kwargs)
        finally:
            module.np = np
            shim.thread.join()

    enc.encode = encode_prefaulted
    return enc


if __name__ == "__main__" and sys.argv[1] == "--check":
    from bertflow import SentenceEncoder

    text = [f"sentence number {i} of the check, with some words" for i in range(3000)]
    plain = SentenceEncoder(sys.argv[2], pooling="mean").encode(text, show_progress_bar=False)
    other = prefaulting(SentenceEncoder(sys.argv[2], pooling="mean")).encode(text, show_progress_bar=False)
    print("same vectors:", np.array_equal(plain, other), "max difference", float(np.abs(plain - other).max()))
elif __name__ == "__main__":
    pair_variant.run(prefaulting)
