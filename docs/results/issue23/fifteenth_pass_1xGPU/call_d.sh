# Session 20, call d: the library's pre-fault (SentenceEncoder.encode writes its result on a thread while the first
# chunk is tokenised; adopted by rule 2 of fourteenth_pass_1xGPU/next_call.sh on calls a and b) as landed, on the GPU:
# (1) every CUDA test file (gpu_checks.py tests, default list), which now includes
#     test_encode_result_written_before_the_first_chunk[cuda];
# (2) three processes pairing the library (defaults) with the library without its pre-fault (no_prefault_variant.py,
#     the "+pair" side): MiniLM-L6 in both orders, BERT-base once.
# Rule, fixed before the call: the pre-fault stays if every CUDA test passes and in each of the three processes the
# library side's main thread has a lower median system time per pass than the "+pair" side (the mechanism as landed);
# a failing CUDA test reverts it. The rates are reported; the adoption rule was calls a and b's.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/fifteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
t0=$(date +%s)
PYTHONPATH=$S:$B:$PWD timeout 280 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 - $OUT/tests.json <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); print("tests", d["counts"], d["exit_status"]); print(d["not_passed"])
if d["exit_status"]: print(d["tail"][-2500:])
PY
echo tests took $(( $(date +%s) - t0 )) s
tp() { # tag arch order
  t1=$(date +%s)
  PYTHONPATH=$S:$B timeout 140 python3 $R/no_prefault_variant.py throughput --pair first_chunk=4096 --pair-order $3 --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 $R/summarise.py $OUT/$1.json || true
  echo $1 took $(( $(date +%s) - t1 )) s
}
tp m1 minilm-l6 ab; tp m2 minilm-l6 ba; tp b1 bert-base ab
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt; ls
