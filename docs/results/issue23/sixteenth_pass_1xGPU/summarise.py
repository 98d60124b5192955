"""Print the sixteenth pass's records and apply the rules fixed before each call (call_a.sh to call_d.sh).

Call a: ``transform_probe.py`` three times (SentenceEncoder.encode, Embedder.encode, Embedder.encode with the
transform on a side stream; profiles) and the transform case's tests. Call b: the tests again, goal 3's scale-out
against the library before the chunk pre-fault, one BERT-base and one MiniLM-L6 throughput process. Call c: the
tests after a leftover test line was dropped, one more BERT-base process. Call d: the tests, ``transform_probe.py``
three times and the scale-out, after ``Embedder.encode`` tells the encoder its calibrator's width. Call e: the tests
after the result's handling moved into ``ResultRows``, one more BERT-base process.

    python docs/results/issue23/sixteenth_pass_1xGPU/summarise.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUNS = (("call_b", "b1"), ("call_b", "m1"), ("call_c", "b2"), ("call_e", "b3"))


def load(call: str, name: str) -> dict:
    return json.loads((HERE / call / f"{name}.json").read_text())


def tests(call: str) -> dict:
    t = load(call, "tests")
    print(f"   tests at {t['commit'][:7]} on {t['card']}: {t['counts']} exit {t['exit_status']} {t['not_passed']}")
    return t


CALS = ("flow", "whitening")
BASE, LIB, SIDE = "SentenceEncoder.encode", "Embedder.encode", "Embedder.encode side stream"

print("== call a")
tests("call_a")
probes = [load("call_a", f"p{i}") for i in (1, 2, 3)]
for i, p in enumerate(probes, 1):
    for c in CALS:
        m = p[c]["median_s"]
        prof = p[c]["profile"]
        print(
            f"   p{i} {c:>9}: {BASE} {m[BASE]:.4f} s, {LIB} {100 * (m[LIB] / m[BASE] - 1):+.2f}%, side stream "
            f"{100 * (m[SIDE] / m[BASE] - 1):+.2f}%, identical {p[c]['identical']}; profiled GPU busy / idle ms: "
            + ", ".join(
                f"{k.split('.')[0][:8]}{' side' if k == SIDE else ''} {v['gpu_busy_ms']:.0f}/{v['gpu_idle_ms']:.0f}"
                for k, v in prof.items()
            )
        )
faster = [all(p[c]["median_s"][SIDE] < p[c]["median_s"][LIB] for c in CALS) for p in probes]
identical = all(p[c]["identical"] for p in probes for c in CALS)
print(
    f"   E. side stream faster for both calibrators in {sum(faster)} of 3, identical {identical} -> "
    f"{'adopt' if sum(faster) >= 2 and identical else 'not adopted'}"
)
over = {c: [100 * (p[c]["median_s"][LIB] / p[c]["median_s"][BASE] - 1) for p in probes] for c in CALS}
print(
    "   B. the library's overhead, medians of 3: "
    + ", ".join(f"{c} {statistics.median(xs):+.2f}% ({', '.join(f'{x:+.2f}' for x in xs)})" for c, xs in over.items())
    + f" -> {'met' if all(statistics.median(xs) <= 2 for xs in over.values()) else 'not met'}"
)
# The library as it now is, six processes: call a, and the fifteenth pass's call h (its pre-faulted side, adopted).
h = [json.loads((HERE.parent / "fifteenth_pass_1xGPU" / "call_h" / f"p{i}.json").read_text()) for i in (1, 2, 3)]
six = {
    c: over[c] + [100 * (p[c]["median_s"]["Embedder.encode prefaulted"] / p[c]["median_s"][BASE] - 1) for p in h]
    for c in CALS
}
print(
    "   the library's overhead over six processes (call a, fifteenth pass call h): "
    + ", ".join(f"{c} median {statistics.median(xs):+.2f}%, {min(xs):+.2f} to {max(xs):+.2f}%" for c, xs in six.items())
)
added = {
    c: statistics.median(p[c]["profile"][LIB]["kernel_ms"] - p[c]["profile"][BASE]["kernel_ms"] for p in probes)
    for c in CALS
}
print(
    "   kernel time the transform adds (profiled pass, median of 3, ms): "
    + ", ".join(f"{c} {v:+.1f}" for c, v in added.items())
)

print("== call b")
tests("call_b")
s = load("call_b", "scaleout")
rounds = [(j["code"], j["summary"]["rows_per_second"]) for j in s["jobs"]]
new = [r for c, r in rounds if c == "new"]
old = [r for c, r in rounds if c == "baseline"]
print(
    f"   scale-out on {s['card']}, {s['rows']} rows: Embedder.encode {s['embedder_encode_rows_per_s'] / 1e3:.1f}k/s; "
    f"distributed-encode {', '.join(f'{r / 1e3:.1f}k' for r in new)} "
    f"(median ratio {s['ratio_distributed_over_embedder']}) "
    f"against the library before the chunk pre-fault {', '.join(f'{r / 1e3:.1f}k' for r in old)} (ratio "
    f"{s['baseline_ratio_distributed_over_embedder']}); stores identical {s['store_equals_baseline_store']}"
)
for j in s["jobs"]:
    r = j["summary"]["per_rank"][0]
    print(f"      {j['code']:>8}: shard seconds {r['shard_seconds']}, warm-up {r['warmup_seconds']} s")
keep = all(a > b for a, b in zip(new, old, strict=True)) and s["store_equals_baseline_store"]
met = "met" if s["ratio_distributed_over_embedder"] >= 0.9 else "not met"
print(f"   G. goal 3 (1 GPU) {met}; the chunk pre-fault {'stays' if keep else 'is reverted'} (faster in both rounds)")
print("== call c")
t = tests("call_c")
print(
    f"   F. {'no test failed: the transform case and the chunk pre-fault stay' if not t['exit_status'] else 'revert'}"
)

print("== call d")
t = tests("call_d")
print(f"   F. {'no test failed: transform_dim stays' if not t['exit_status'] else 'a test failed: revert 6c72790'}")
probes_d = [load("call_d", f"p{i}") for i in (1, 2, 3)]
over_d = {c: [100 * (p[c]["median_s"][LIB] / p[c]["median_s"][BASE] - 1) for p in probes_d] for c in CALS}
print(
    "   B. the library's overhead with transform_dim, medians of 3: "
    + ", ".join(f"{c} {statistics.median(xs):+.2f}% ({', '.join(f'{x:+.2f}' for x in xs)})" for c, xs in over_d.items())
    + f" -> {'met' if all(statistics.median(xs) <= 2 for xs in over_d.values()) else 'not met'}"
)
s = load("call_d", "scaleout")
rates = [j["summary"]["rows_per_second"] for j in s["jobs"]]
print(
    f"   G. scale-out, {s['rows']} rows: Embedder.encode {s['embedder_encode_rows_per_s'] / 1e3:.1f}k/s, "
    "distributed-encode "
    f"{', '.join(f'{r / 1e3:.1f}k' for r in rates)}: ratio {s['ratio_distributed_over_embedder']} -> goal 3 (1 GPU) "
    f"{'met' if s['ratio_distributed_over_embedder'] >= 0.9 else 'not met'}; store equals Embedder.encode at the same "
    f"chunks: {s['store_equals_embedder_encode_same_chunks']}"
)
for j in s["jobs"]:
    print(f"      shard seconds {j['summary']['per_rank'][0]['shard_seconds']}")

print("== call e")
t = tests("call_e")
print(
    f"   F. {'no test failed: ResultRows (38cd26a) stays' if not t['exit_status'] else 'a test failed: revert 38cd26a'}"
)

# The fifteenth pass's reader of throughput records, given the files, prints only them.
print("== throughput, the defaults (calls b, c and e)", flush=True)
reader = HERE.parent / "fifteenth_pass_1xGPU" / "summarise.py"
subprocess.run([sys.executable, str(reader), *(str(HERE / c / f"{n}.json") for c, n in RUNS)], check=True)
