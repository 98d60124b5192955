# Session 15, call b: sentences checked in the tokeniser workers (HEAD) against fcfb61f (base/src), interleaved,
# order alternating; then the CUDA tests at HEAD.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag arch src
  PYTHONPATH=$3:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', d['file'].split('/')[-4], {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3 4 5; do
  if [ $((i % 2)) = 1 ]; then tp m_base$i minilm-l6 $G/base/src; tp m_new$i minilm-l6 $S
  else tp m_new$i minilm-l6 $S; tp m_base$i minilm-l6 $G/base/src; fi
done
tp b_new1 bert-base $S; tp b_base1 bert-base $G/base/src; tp b_base2 bert-base $G/base/src; tp b_new2 bert-base $S
PYTHONPATH=$S:$B timeout 200 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) --json $OUT/cuda_tests.json 2>&1 | tail -3
rm -f $OUT/err.txt
