"""Print every process of the fourteenth pass's calls from their JSON records.

Calls a and b (``gpu_checks.py throughput --pair``): for each encoder of a process, the first pass, the warm median,
every round with min / median / max of the five warm rounds, the ruler (ms a repetition), and each pass's main-thread
CPU time, chunk waits and tokenisation workers' CPU time. Call c (``distributed_encode.py``): rows/s and efficiency.

    python docs/results/issue23/fourteenth_pass_1xGPU/summarise.py
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
for call in sorted(p for p in HERE.glob("call_*") if p.is_dir()):
    print(f"== {call.name}")
    tests = call / "tests.json"
    if tests.exists():
        t = json.loads(tests.read_text())
        print(f"   tests at {t['commit']} on {t['card']}: {t['counts']} exit {t['exit_status']}")
    for f in sorted(call.glob("*.json")):
        if f.name == "tests.json":
            continue
        d = json.loads(f.read_text())
        for name, r in d["runs"].items():
            warm = [x / 1e3 for x in r["rounds"][1:]]
            print(
                f"   {f.stem:>6} {name:>15} {r.get('settings', 'defaults'):>22}: first {r['rounds'][0] / 1e3:.1f}k, "
                f"warm min/median/max {min(warm):.1f}/{statistics.median(warm):.1f}/{max(warm):.1f}k, "
                f"ruler {[round(x, 2) for x in r.get('ruler_ms', [])]}"
            )
            for rate, c in zip(r["rounds"], r.get("counters", []), strict=False):
                print(
                    f"      {rate / 1e3:6.1f}k main cpu {c['main_cpu_s']:.3f}s "
                    f"chunk wait {c['main_chunk_wait_s']:.3f}s workers {c['worker_cpu_s']:.2f}s"
                )
    for f in sorted(call.glob("round*/distributed_encode.json")):
        d = json.loads(f.read_text())
        rates = {n: round(r["rows_per_second"] / 1e3, 1) for n, r in d["runs"].items()}
        print(f"   {f.parent.name} {d['card']} shards {d['shard_size']}: rows/s (k) by GPUs {rates}, {d['scaling']}")
