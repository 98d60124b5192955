# Session 14, call h: CUDA tests at the split (8ac54d8: tokenization / wordpiece / tokenizer_pool), and a second
# machine's interleaved first passes: b073a68 (base14/) vs 8ac54d8, MiniLM-L6 also with the packed bucket at 4,096.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; H=$G/base14/src; C=$(cat $G/commit)
PYTHONPATH=$S:$B timeout 200 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_H200_$C.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['counts'], d['not_passed'])" $OUT/cuda_tests_H200_$C.json
tp() { # tag arch src [extra args]
  PYTHONPATH=$3:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 $4 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
tp m_base$i minilm-l6 $H
tp m_new$i minilm-l6 $S
tp m_new_b4096_$i minilm-l6 $S "--bucket 4096"
done
for i in 1 2 3; do
tp b_base$i bert-base $H
tp b_new$i bert-base $S
done
rm -f $OUT/err.txt
