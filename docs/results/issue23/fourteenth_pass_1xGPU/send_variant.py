"""Issue 23, for a later call: ``gpu_checks.py throughput --pair SETTINGS`` with the pair's encoder sending each
part of a chunk to its tokenisation worker in one pipe write instead of two, the other encoder as the library is.
Pass settings equal to the defaults, so this is the only difference between the sides.

Why: ``multiprocessing.connection.Connection`` writes a message over 16 KB as two writes (its 4-byte header, then
the pickle), and each write lets the GIL go; a part of the first chunk (4,096 STS sentences over 12 workers, about
21 KB) so took two writes, each waiting up to one switch interval for the GIL while the feeder held it: 12.4 ms of
the first chunk's 27.6 ms latency (thirteenth pass, call d's timeline). Here the header and the pickle go in one
write (the same bytes on the wire, so ``recv`` reads them as before). The pair's workers are forked while its
encode runs, so they reply the same way.

    python send_variant.py throughput --pair first_chunk=4096 --tokenizer-dir ...   # the rest: gpu_checks.py's
    python send_variant.py --check MODEL_DIR   # on CPU, 2 workers: both sides give the same vectors
"""

from __future__ import annotations

import struct
import sys
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pair_variant  # puts src/ and benchmarks/ on sys.path

ONE_WRITE = {"on": False, "writes": 0}
_stock = Connection._send_bytes


def _send_bytes(self: Connection, buf: Any) -> None:
    n = len(buf)
    if ONE_WRITE["on"] and 16384 < n <= 0x7FFFFFFF:
        ONE_WRITE["writes"] += 1
        self._send(struct.pack("!i", n) + bytes(buf))  # type: ignore[attr-defined]
    else:
        _stock(self, buf)


Connection._send_bytes = _send_bytes  # type: ignore[method-assign]


def one_write(enc: Any) -> Any:
    """``enc`` with an ``encode`` during which messages over 16 KB go in one write."""
    encode = enc.encode

    def encode_one_write(*args: Any, **kwargs: Any) -> Any:
        ONE_WRITE["on"] = True
        try:
            return encode(*args, **kwargs)
        finally:
            ONE_WRITE["on"] = False

    enc.encode = encode_one_write
    return enc


if __name__ == "__main__" and sys.argv[1] == "--check":
    from bertflow import SentenceEncoder
    from bertflow.encoding.settings import EncodeSettings

    text = [f"sentence number {i} of the check, with a few more words to make the parts large" for i in range(6000)]
    settings = EncodeSettings(tokenize_processes=2, chunk_size=3000)
    plain = SentenceEncoder(sys.argv[2], pooling="mean", settings=settings).encode(text, show_progress_bar=False)
    other = one_write(SentenceEncoder(sys.argv[2], pooling="mean", settings=settings))
    vectors = other.encode(text, show_progress_bar=False)
    print("same vectors:", np.array_equal(plain, vectors), "one-write sends in this process:", ONE_WRITE["writes"])
elif __name__ == "__main__":
    pair_variant.run(one_write)
