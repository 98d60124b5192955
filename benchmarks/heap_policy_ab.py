"""CPU encoding speed under three glibc heap policies (issue 24 item 9's memory fix, issue 23 goal 5's speed).

``trim``: bertflow's own, ``malloc_trim(0)`` once per chunk (``resources.return_free_memory``); ``none``: that call
disabled (glibc's defaults: fast, but resident memory climbs over a long stream); ``fixed``: the mmap threshold fixed
at glibc's starting 128 KiB (``mallopt``), the first fix tried, which bounds memory by mapping every activation anew.
Run the variants alternately in separate processes (a threshold is process-wide and cannot be undone):

    for v in none trim fixed none trim fixed none trim fixed; do python benchmarks/heap_policy_ab.py $v; done

Prints sentences/s of the embedded default model on 1,000 STS-B sentences and 100 paragraph-length texts, and the
peak RSS. ``--data-dir`` is the STS folder (default ../shared/data/sts).
"""

from __future__ import annotations

import argparse
import csv
import random
import resource
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=["trim", "none", "fixed"])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/sts"))
    args = parser.parse_args()
    import bertflow.encoding.encoder as encoder_module

    if args.variant != "trim":  # the encoder calls the name it imported
        encoder_module.return_free_memory = lambda: False
    if args.variant == "fixed":
        import ctypes

        m_mmap_threshold = -3  # <malloc.h>
        assert ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, 128 << 10) == 1
    from bertflow import SentenceEncoder

    with open(args.data_dir / "STSBenchmark" / "train.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = sorted({r[i] for r in rows[1:] if len(r) > 2 for i in (-2, -1)})
    random.Random(0).shuffle(sentences)
    short = sentences[:1000]
    paragraphs = [" ".join(sentences[1000 + 8 * k : 1008 + 8 * k]) for k in range(100)]
    encoder = SentenceEncoder(device="cpu")
    encoder.encode(sentences[5000:5200])  # warm-up
    out = []
    for name, texts in (("sts", short), ("paragraphs", paragraphs)):
        start = time.perf_counter()
        encoder.encode(texts)
        out.append(f"{name} {len(texts) / (time.perf_counter() - start):.1f}/s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(args.variant, *out, f"peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
