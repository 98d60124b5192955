"""Print every process of the fourteenth pass's calls from their JSON records.

Calls a and b (``gpu_checks.py throughput --pair``): for each encoder of a process, the first pass, the warm median,
every round with min / median / max of the warm rounds, the ruler (ms a repetition), and each pass's main-thread
CPU time, chunk waits and tokenisation workers' CPU time (calls d and e: split into user and system time, with
minor faults and preemptions; call e: the full collections in the pass). In call e (``gc_variant.py``) the
``+pair`` side is the code before the deferral, the other side the deferral.
Call c (``distributed_encode.py``): rows/s and efficiency.

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
                    + (
                        f" (user {c['worker_user_s']:.2f}s, system {c['worker_system_s']:.2f}s, "
                        f"faults {c['worker_minor_faults']}, preempted {c['worker_preemptions']})"
                        if "worker_user_s" in c
                        else ""
                    )
                    + (f" full collections {c['full_collections']}" if "full_collections" in c else "")
                )
    for f in sorted(call.glob("round*/distributed_encode.json")):
        d = json.loads(f.read_text())
        rates = {n: round(r["rows_per_second"] / 1e3, 1) for n, r in d["runs"].items()}
        print(f"   {f.parent.name} {d['card']} shards {d['shard_size']}: rows/s (k) by GPUs {rates}, {d['scaling']}")

# Goal tallies: first passes of the code as it stands (defaults), per architecture. Call e's "+pair" side ran the
# code before the deferral, which is the code as it stands; its other side is listed apart.
print("== first passes of the defaults (calls a, b and d; call e's +pair side)")
tally: dict[str, list[float]] = {}
apart: dict[str, list[float]] = {}
for f in sorted(HERE.glob("call_[abde]/*.json")):
    if f.name == "tests.json":
        continue
    for name, r in json.loads(f.read_text())["runs"].items():
        arch = name.split("+")[0]
        defaults = name.endswith("+pair") if f.parent.name == "call_e" else not name.endswith("+pair")
        (tally if defaults else apart).setdefault(f"{arch} {f.parent.name}", []).append(r["rounds"][0] / 1e3)
for arch, bar in (("minilm-l6", 350.0), ("bert-base", 150.0)):
    firsts = [x for key, xs in tally.items() if key.startswith(arch) for x in xs]
    print(
        f"   {arch}: {len(firsts)} processes, {sum(x >= bar for x in firsts)} at {bar:.0f}k or more, "
        f"{min(firsts):.1f}-{max(firsts):.1f}k, median {statistics.median(firsts):.1f}k; "
        + ", ".join(
            f"{key.split()[1]} {[round(x, 1) for x in xs]}" for key, xs in tally.items() if key.startswith(arch)
        )
    )
others = {key: [round(x, 1) for x in xs] for key, xs in apart.items()}
print(f"   not the defaults (other settings, or call e's deferral): {others}")

# Calls a and b: does a warm pass's rate follow its workers' CPU time or the ruler?
from scipy.stats import spearmanr  # noqa: E402

for arch in ("minilm-l6", "bert-base"):
    rows = []
    for f in sorted(HERE.glob("call_[ab]/*.json")):
        if f.name != "tests.json":
            for name, r in json.loads(f.read_text())["runs"].items():
                if name.startswith(arch):
                    rows += list(zip(r["rounds"], r["counters"], r["ruler_ms"], strict=True))[1:]
    rate = [x[0] for x in rows]
    workers = [x[1]["worker_cpu_s"] for x in rows]
    print(
        f"   calls a-b {arch}: {len(rows)} warm passes, Spearman rate~workers' CPU "
        f"{spearmanr(rate, workers).statistic:.2f}, rate~ruler {spearmanr(rate, [x[2] for x in rows]).statistic:.2f}"
    )
