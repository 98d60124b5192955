export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag arch src settings
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
S=$PWD/src; O=$G/prevtok/src
for i in 1 2; do
tp m_prev$i minilm-l6 $O
tp m_new$i minilm-l6 $S
done
tp b_prev bert-base $O
tp b_new bert-base $S
PYTHONPATH=$S timeout 100 python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/encoding/test_tokenization.py 2>&1 | grep -E "passed|failed" | tail -2
rm -f $OUT/err.txt
