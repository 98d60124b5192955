# Session 18, call a: (1) every CUDA test file (gpu_checks.py tests, default list) at the commit that moved the Triton
# kernels to encoding/triton_kernels.py (one shared attention tile); (2) a py-spy profile of one graphed MiniLM-L6
# process (every thread: where the chunk preparation goes); (3) interleaved throughput of the old code (85f7f0e, the
# kernels in a closure) and the new one, MiniLM-L6 (graphed) and BERT-base (eager packed). Rule fixed before the call:
# the move is kept if every CUDA test passes; its speed is reported (same kernels: expected equal within noise).
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
t0=$(date +%s)
PYTHONPATH=$S:$B:$PWD timeout 300 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 - $OUT/tests.json <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); print("tests", d["counts"], d["exit_status"]); print(d["not_passed"])
if d["exit_status"]: print(d["tail"][-2500:])
PY
echo tests took $(( $(date +%s) - t0 )) s
(cd $G && ./py-spy record --format speedscope -o $OUT/spy_g.json --idle --threads --nonblocking -r 1000 -- python3 $R/eleventh_pass_1xGPU/spy_probe.py minilm-l6 default > $OUT/p.txt 2>&1; grep -E '^\{|Samples' $OUT/p.txt; gzip $OUT/spy_g.json) || tail -5 $OUT/p.txt
tp() { # tag src arch
  PYTHONPATH=$2:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $3 --rounds 3 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    print(f"{sys.argv[2]:>10} {d['file'][-40:]} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
    for rate, c in zip(r["rounds"], r["counters"]):
        print(f"    {rate/1e3:6.1f}k main cpu {c['main_cpu_s']:.3f}s chunk wait {c['main_chunk_wait_s']:.3f}s chunks {c['chunks']} workers {c['worker_cpu_s']:.2f}s proc {c['process_cpu_s']:.2f}s")
PY
}
for i in 1 2; do tp minilm_new$i $S minilm-l6; tp minilm_old$i $G/base/src minilm-l6; done
tp bert_old1 $G/base/src bert-base; tp bert_new1 $S bert-base
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt p.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt p.txt; ls
