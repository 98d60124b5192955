"""Time the tokeniser's WordPiece shortcut on CPU: 20,000 STS sentences it has not seen, then 2,048 more five times
(min and median). Run once per code version, e.g. from the repo root:
    PYTHONPATH=OLD/src python docs/results/issue23/narrow_budget_1xH200/tokenise_probe.py old TOK STS
    PYTHONPATH=src     python docs/results/issue23/narrow_budget_1xH200/tokenise_probe.py new TOK STS
(TOK: the packaged tokenizer folder, STS: the STS data; the numbers in docs/performance.md came from the 2-core
development VM, twice each, alternating, while CI ran beside it)."""
import sys
import time
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

sys.path.insert(0, str(next(d for d in Path(__file__).resolve().parents if (d / "benchmarks").is_dir()) / "benchmarks"))
from gpu_checks import sts_pool  # noqa: E402

from bertflow.encoding.tokenization import WordPieceShortcut, tokenize_arrays, truncating_copy  # noqa: E402

label, tok_dir, sts_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
rust = truncating_copy(AutoTokenizer.from_pretrained(str(tok_dir)), 64)
pool = sts_pool(sts_dir)
text = [pool[i] for i in np.random.default_rng(0).permutation(np.arange(40000) % len(pool))]
shortcut = WordPieceShortcut.from_tokenizer(rust)
t = time.perf_counter()
tokenize_arrays(rust, text[:20000], shortcut)
first = time.perf_counter() - t
times = []
for _ in range(5):
    t = time.perf_counter()
    tokenize_arrays(rust, text[20000:22048], shortcut)
    times.append(time.perf_counter() - t)
print(f"{label} first 20k (new words) {first * 1e3:.1f} ms; 2048 sentences min {min(times) * 1e3:.2f} "
      f"median {sorted(times)[2] * 1e3:.2f} ms")
