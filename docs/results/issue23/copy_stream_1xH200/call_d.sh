# Session 14, call d: chunk results copied on a stream of their own into pageable memory (no pinned buffer per
# chunk) = working tree, against b073a68 (base14/). CUDA tests, the pass probe, interleaved throughput.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; H=$G/base14/src; C=copy-stream
PYTHONPATH=$S:$B timeout 200 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['counts'], d['not_passed'])" $OUT/cuda_tests.json
for arch in minilm-l6 bert-base; do
echo "== $arch new"; PYTHONPATH=$S PROBE_PASSES=2 timeout 120 python3 $G/pass_probe.py $arch 2>&1 | grep -v shards | grep "pass\|launch\|finish\|device per"
done
tp() { # tag arch src
  PYTHONPATH=$3:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
tp m_base$i minilm-l6 $H
tp m_new$i minilm-l6 $S
done
for i in 1 2; do
tp b_base$i bert-base $H
tp b_new$i bert-base $S
done
rm -f $OUT/err.txt
