# Final code: CUDA tests, then HEAD-of-session (526810c, head/src) vs final, interleaved; 12 tokeniser processes; worker probe.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; H=$G/head/src; C=$(git rev-parse --short HEAD 2>/dev/null || cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_H200_$C.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['commit'], d['counts'], d['not_passed'])" $OUT/cuda_tests_H200_$C.json
tp() { # tag arch src settings
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
tp m_head$i minilm-l6 $H
tp m_new$i minilm-l6 $S
done
tp m_new_p12_1 minilm-l6 $S tokenize_processes=12
tp m_new_p12_2 minilm-l6 $S tokenize_processes=12
for i in 1 2; do
tp b_head$i bert-base $H
tp b_new$i bert-base $S
done
PYTHONPATH=$S PROBE_PASSES=2 timeout 100 python3 $G/worker_probe.py minilm-l6 2>&1 | grep -v shards
rm -f $OUT/err.txt
