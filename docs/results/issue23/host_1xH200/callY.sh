# Final code (faster shortcut scans) vs e84ec05 (pipe/) vs 526810c (head/), interleaved; CUDA tests; shortcut probe on the host CPU.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; H=$G/head/src; P=$G/pipe/src; C=$(cat $G/commit)
PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_H200_$C.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['counts'], d['not_passed'])" $OUT/cuda_tests_H200_$C.json
for i in 1 2; do
PYTHONPATH=$P python3 $G/tokenise_probe.py e84ec05 $G/tok $G/sts 2>&1 | tail -1
PYTHONPATH=$S python3 $G/tokenise_probe.py final $G/tok $G/sts 2>&1 | tail -1
done
tp() { # tag arch src
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
tp m_head$i minilm-l6 $H
tp m_pipe$i minilm-l6 $P
tp m_final$i minilm-l6 $S
done
tp b_head bert-base $H
tp b_final bert-base $S
PYTHONPATH=$S PROBE_PASSES=2 timeout 100 python3 $G/worker_probe.py minilm-l6 2>&1 | grep -v shards
rm -f $OUT/err.txt
