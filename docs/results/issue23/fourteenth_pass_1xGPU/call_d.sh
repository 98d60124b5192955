# Session 19, call d: why a warm pass swings. In calls a and b, every slow warm pass (MiniLM-L6 245.7-355.9k, BERT-base
# 115.4-132.2k) had its tokenisation workers spend 0.56-0.86 s of CPU against about 0.40-0.45 s for the same sentences
# in the other passes (Spearman rho -0.68 between a MiniLM-L6 pass's rate and its workers' CPU, 40 passes). The
# counters now split the workers' CPU into user and system time, minor page faults and involuntary switches.
# Reading fixed before the call, over the slow passes (workers' CPU >= 1.25x the process's median pass):
#   extra CPU >= 70% user time, faults and preemptions within 20% of the process's median pass -> the same work ran on
#   slower cores (contention below the virtual machine): explained, not removable by the library;
#   mostly system time or faults -> the kernel's memory work: try a fix next;
#   preemptions >= 2x -> too many runnable threads: try fewer workers next.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node|MHz|L3|Hypervisor"; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null
tp() { # tag arch
  t1=$(date +%s)
  PYTHONPATH=$S:$B timeout 120 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 8 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d["runs"].items():
    print(f"{sys.argv[2]} {name} first {r['rounds'][0]/1e3:.1f}k")
    for rate, c, ru in zip(r["rounds"], r["counters"], r["ruler_ms"]):
        print(f"  {rate/1e3:6.1f}k ruler {ru:.2f} wait {c['main_chunk_wait_s']:.3f} workers {c['worker_cpu_s']:.2f} = user {c['worker_user_s']:.2f} + sys {c['worker_system_s']:.2f}, faults {c['worker_minor_faults']}, preempted {c['worker_preemptions']}, main {c['main_cpu_s']:.3f}")
PY
  echo $1 took $(( $(date +%s) - t1 )) s
}
tp m1 minilm-l6; tp m2 minilm-l6; tp b1 bert-base; tp m3 minilm-l6
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
