# Session 14, call j: the prefetcher's switch interval, more pairs. MiniLM-L6 and BERT-base first passes at
# 74cfd51: default 0.5 ms, 0.1 ms, 0.25 ms (fast_si.py), interleaved.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
tp() { # tag arch prefix... (the command before gpu_checks.py)
  local tag=$1 arch=$2; shift 2
  PYTHONPATH=$S:$B timeout 90 "$@" $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $arch --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$tag', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3 4; do
tp m_def$i minilm-l6 python3
tp m_si01_$i minilm-l6 python3 $G/fast_si.py 0.0001
tp m_si025_$i minilm-l6 python3 $G/fast_si.py 0.00025
done
for i in 1 2; do
tp b_def$i bert-base python3
tp b_si01_$i bert-base python3 $G/fast_si.py 0.0001
done
rm -f $OUT/err.txt
