# Session 14, call i: GIL contention in the launching thread. MiniLM-L6 first passes at 74cfd51: default (the
# prefetcher holds a 0.5 ms switch interval, 2 preparing threads), a 0.1 ms interval, one preparing thread.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
tp() { # tag arch prefix... (the command before gpu_checks.py)
  local tag=$1 arch=$2; shift 2
  PYTHONPATH=$S:$B timeout 90 "$@" $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $arch --rounds 3 $EXTRA --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$tag', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
EXTRA= tp m_def$i minilm-l6 python3
EXTRA= tp m_si01_$i minilm-l6 python3 $G/fast_si.py 0.0001 
EXTRA="--settings tokenize_workers=1" tp m_w1_$i minilm-l6 python3
done
rm -f $OUT/err.txt
