# Session 14, call a: where the first pass's time goes after tokenisation (pass_probe), and whether a larger
# warm-up (allocator / cuBLAS shapes; the memo is seeded with every vocabulary word, so synthetic text warms no STS
# word) or expandable segments change the first pass. Working tree = b073a68.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo "commit $(cat $G/commit)"; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$S timeout 120 python3 $G/pass_probe.py minilm-l6 2>&1 | grep -v shards
tp() { # tag arch warmup [env]
  env $4 PYTHONPATH=$S:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --warmup $3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2; do
tp m_w20k$i minilm-l6 20000
tp m_w80k$i minilm-l6 80000
tp m_exp$i minilm-l6 20000 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
done
tp b_w20k bert-base 20000
tp b_w80k bert-base 80000
PYTHONPATH=$S timeout 120 python3 $G/pass_probe.py bert-base 2>&1 | grep -v shards
rm -f $OUT/err.txt
