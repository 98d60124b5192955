"""The benchmark harness: bertflow's encoder against ``SentenceTransformer.encode``, flow fitting, calibrator
overhead, memory. It lives beside the package (``benchmarks/``), not in it, and uses only bertflow's public API.

Every comparison runs both sides in one process on the same model, sentences, device and precision, in
alternating rounds (A B, then B A, ...), and reports the median: background load on a shared machine then
hits both sides alike, and the printed ratio is measured, not assembled from separate runs.

Modules: :mod:`.common` (text sets, random-weight models, FLOP and padding counts, timing, environment, results
file), :mod:`.encode` (encoding comparisons and variants, the bare forward pass, calibrator overhead), :mod:`.flow`
(flow fitting), :mod:`.memory` (peak memory of ``bertflow encode``), :mod:`.ruler` (the host's own speed beside a
benchmark) and :mod:`.suites` (the GPU suite and the CPU comparison). Scripts in ``benchmarks/`` import it as
``harness`` (they run with ``benchmarks/`` first on ``sys.path``); ``benchmarks/bench.py`` is the command line.
"""

from .common import (
    H100_BF16_PEAK,
    MODEL_CONFIGS,
    build_random_model,
    environment,
    interleave,
    long_texts,
    model_flops,
    replicate,
    save_json,
    st_padded_tokens,
    sts_sentences,
    synthetic_sentences,
)
from .encode import bench_calibrator_overhead, bench_encode, bench_forward
from .flow import bench_flow_fit, bench_flow_fit_gpu
from .memory import bench_memory
from .ruler import Ruler
from .suites import CPU_VARIANTS, SUITE_SCALES, SUITE_VARIANTS, cpu_comparison, run_suite

__all__ = [
    "CPU_VARIANTS",
    "H100_BF16_PEAK",
    "MODEL_CONFIGS",
    "Ruler",
    "SUITE_SCALES",
    "SUITE_VARIANTS",
    "bench_calibrator_overhead",
    "bench_encode",
    "bench_flow_fit",
    "bench_flow_fit_gpu",
    "bench_forward",
    "bench_memory",
    "build_random_model",
    "cpu_comparison",
    "environment",
    "interleave",
    "long_texts",
    "model_flops",
    "replicate",
    "run_suite",
    "save_json",
    "st_padded_tokens",
    "sts_sentences",
    "synthetic_sentences",
]
