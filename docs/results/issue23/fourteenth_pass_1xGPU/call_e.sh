# Session 19, call e: full collections deferred while the CUDA chunk pipeline runs (batching.DEFER_FULL_COLLECTIONS,
# GC_THRESHOLDS held by the low-latency Prefetcher), against the code before, in the same process: gc_variant.py
# runs the pair's encoder (settings equal to the defaults) with the deferral off. Call d's slow passes without a
# worker slowdown had the main thread spend 37-60 ms more CPU (0.089 and 0.112 s against about 0.05 s); a full
# collection of this process's heap (~390k objects) took 138 ms on the 2-core VM. The counters now count the full
# collections in each pass and their seconds.
# Rule fixed before the call: the deferral is kept if (1) no deferred pass holds a full collection, (2) the deferred
# side's slowest warm round is at least the other side's in 3 of 4 MiniLM-L6 processes, and (3) over the four, the
# median of the deferred side's first passes and of its warm medians is not more than 3% below the other side's;
# BERT-base's pair (one process) must not be more than 3% slower in its first pass and warm median.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/fourteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag arch order
  t1=$(date +%s)
  PYTHONPATH=$S:$B timeout 140 python3 $R/gc_variant.py throughput --pair first_chunk=4096 --pair-order $3 --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d["runs"].items():
    side = "before (no deferral)" if name.endswith("+pair") else "deferred"
    c = r["counters"]
    print(f"{sys.argv[2]:>4} {side:>20} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k min {min(r['rounds'][1:])/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]}")
    print(f"      full collections {[x['full_collections'] for x in c]} ms {[round(x['full_collection_s']*1e3) for x in c]} main cpu ms {[round(x['main_cpu_s']*1e3) for x in c]} workers s {[round(x['worker_cpu_s'],2) for x in c]} ruler {[round(x,2) for x in r['ruler_ms']]}")
PY
  echo $1 took $(( $(date +%s) - t1 )) s
}
tp m1 minilm-l6 ab; tp m2 minilm-l6 ba; tp m3 minilm-l6 ab; tp m4 minilm-l6 ba; tp b1 bert-base ab
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
