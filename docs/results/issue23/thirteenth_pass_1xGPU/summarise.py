"""Print every process of the thirteenth pass's calls (a-e) from their JSON records: first pass, warm median, rounds,
the ruler (ms a repetition) and, where recorded, the main thread's CPU time and chunk waits per pass.

    python docs/results/issue23/thirteenth_pass_1xGPU/summarise.py
"""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
for call in sorted(p for p in HERE.glob("call_*") if p.is_dir()):
    print(f"== {call.name}")
    tests = call / "tests.json"
    if tests.exists():
        t = json.loads(tests.read_text())
        print(f"   tests {t['counts']} exit {t['exit_status']} not passed {sorted(t['not_passed'])}")
    firsts: dict[str, list[float]] = {}
    warms: dict[str, list[float]] = {}
    for f in sorted(call.glob("*.json")):
        if f.name == "tests.json":
            continue
        d = json.loads(f.read_text())
        for arch, r in d["runs"].items():
            kind = f.stem.rstrip("0123456789").rstrip("_")
            firsts.setdefault(kind, []).append(r["rounds"][0] / 1e3)
            warms.setdefault(kind, []).append(r["warm_sentences_per_s"] / 1e3)
            ruler = [round(x, 2) for x in r.get("ruler_ms", [])]
            print(
                f"   {f.stem:>16} {arch} {'old src ' if 'base/src' in d['file'] else ''}settings {d['settings']}: first {r['rounds'][0] / 1e3:.1f}k, warm median "
                f"{r['warm_sentences_per_s'] / 1e3:.1f}k, rounds {[round(x / 1e3, 1) for x in r['rounds']]}, "
                f"ruler {ruler}"
            )
            for rate, c in zip(r["rounds"], r.get("counters", []), strict=False):
                print(
                    f"      {rate / 1e3:6.1f}k main cpu {c['main_cpu_s']:.3f}s "
                    f"chunk wait {c['main_chunk_wait_s']:.3f}s workers {c['worker_cpu_s']:.2f}s"
                )
    for kind in sorted(firsts):
        print(
            f"   {kind:>16}: first passes median {statistics.median(firsts[kind]):.1f}k "
            f"[{min(firsts[kind]):.1f}-{max(firsts[kind]):.1f}], "
            f"warm medians median {statistics.median(warms[kind]):.1f}k"
        )
sys.exit(0)
