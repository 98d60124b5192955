# Workers returned after every reply is read (working tree) vs cb0f92d (pipe2/) vs 526810c (head/), interleaved; tokenisation tests on the card.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; H=$G/head/src; P=$G/pipe2/src
PYTHONPATH=$S timeout 120 python3 -m pytest -q -p no:cacheprovider tests/encoding/test_tokenization.py 2>&1 | tail -1
tp() { # tag arch src
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
tp m_head$i minilm-l6 $H
tp m_cb0f$i minilm-l6 $P
tp m_final$i minilm-l6 $S
done
PYTHONPATH=$S PROBE_PASSES=2 timeout 100 python3 $G/worker_probe.py minilm-l6 2>&1 | grep -v shards
rm -f $OUT/err.txt
