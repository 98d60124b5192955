# Session 16, call a: why does one process run MiniLM-L6 at 256k and the next, same code, same machine, at 398k?
# Ten MiniLM-L6 processes and three BERT-base processes of main, each with `--counters` (per pass: the main
# thread's CPU time, context switches and waits for prepared chunks; each tokeniser worker's CPU time; the machine's
# busy, idle and stolen core-seconds). Nothing is compared against a variant: this call only looks.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nproc; lscpu | grep -E 'Model name|Thread|Core|Socket|NUMA node\(s\)|MHz'; cat /proc/loadavg
tp() { # tag arch
  PYTHONPATH=$S:$B timeout 120 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --counters --json $OUT/$1.json > /dev/null 2>$OUT/err.txt || tail -3 $OUT/err.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    for rate, c in zip(r["rounds"], r["counters"]):
        w = c["workers_cpu_s"]
        print(f"{sys.argv[2]:>9} {rate/1e3:6.1f}k main {c['main_cpu_s']:.3f}s wait {c['main_chunk_wait_s']:.3f}s "
              f"vol {c['main_voluntary_switches']} inv {c['main_involuntary_switches']} proc {c['process_cpu_s']:.2f}s "
              f"workers {c['worker_cpu_s']:.2f}s [{min(w, default=0):.2f}-{max(w, default=0):.2f}] "
              f"host busy {c['host_busy_s']:.2f} idle {c['host_idle_s']:.2f} steal {c['host_steal_s']:.2f}")
PY
  cat /proc/loadavg
}
for i in 1 2 3 4 5 6 7 8 9 10; do tp minilm_$i minilm-l6; done
for i in 1 2 3; do tp bert_$i bert-base; done
rm -f $OUT/err.txt
