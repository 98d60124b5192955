# Session 19, call a: (1) every CUDA test file (gpu_checks.py tests, default list) at 7c0e23b, the first GPU run of
# fused._launch / fused._one_stride (session 18's review mend, interpreter-tested only); (2) the first two of the
# three BERT-base graph pairs that thirteenth_pass_1xGPU/next_call.sh planned, rule unchanged: graphs become the
# default for 768-wide models if the graphed side's first pass beats the eager side's in 3 of 3 processes and its
# warm median is higher in at least 2 of 3. Rule for (1): the refactor stays if every CUDA test passes.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
t0=$(date +%s)
PYTHONPATH=$S:$B:$PWD timeout 280 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 - $OUT/tests.json <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); print("tests", d["counts"], d["exit_status"]); print(d["not_passed"])
if d["exit_status"]: print(d["tail"][-2500:])
PY
echo tests took $(( $(date +%s) - t0 )) s
tp() { # tag arch pair order
  t1=$(date +%s)
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --pair $3 --pair-order $4 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d["runs"].items():
    print(f"{sys.argv[2]:>8} {name:>16} {r.get('settings', 'defaults'):>22} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
PY
  echo $1 took $(( $(date +%s) - t1 )) s
}
tp b_g1 bert-base graphs=true ab; tp b_g2 bert-base graphs=true ba
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt; ls
