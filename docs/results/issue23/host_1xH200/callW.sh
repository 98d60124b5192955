# HEAD (executor pool, one C loop per chunk's check) vs exec (executor pool, sliced check) vs src (pipe pool + sliced check), interleaved.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; H=$G/head/src; E=$G/exec/src
tp() { # tag arch src
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3; do
tp m_head$i minilm-l6 $H
tp m_exec$i minilm-l6 $E
tp m_pipe$i minilm-l6 $S
done
tp b_head bert-base $H
tp b_pipe bert-base $S
PYTHONPATH=$S PROBE_PASSES=2 timeout 100 python3 $G/worker_probe.py minilm-l6 2>&1 | grep -v shards
rm -f $OUT/err.txt
