# Session 14, call l: switch interval 0.25 ms against the 0.5 ms default, six more interleaved MiniLM-L6 pairs at
# 527be2d. Decision rule fixed before the call: adopt 0.25 ms if it wins >= 11 of the 14 pairs of calls j, k and l
# (one-sided sign test p < 0.05) and its mean is higher.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
tp() { # tag arch prefix... (the command before gpu_checks.py)
  local tag=$1 arch=$2; shift 2
  PYTHONPATH=$S:$B timeout 90 "$@" $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $arch --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$tag', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3 4 5 6; do
if [ $((i % 2)) = 1 ]; then
tp m_def$i minilm-l6 python3; tp m_si025_$i minilm-l6 python3 $G/fast_si.py 0.00025
else
tp m_si025_$i minilm-l6 python3 $G/fast_si.py 0.00025; tp m_def$i minilm-l6 python3
fi
done
rm -f $OUT/err.txt
