export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag arch src settings [env]
  env $5 PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
S=$PWD/src; P=$G/split/src
tp m_def minilm-l6 $S
tp m_131k minilm-l6 $S max_tokens=131072,min_tokens=131072
tp m_262k minilm-l6 $S max_tokens=262144,min_tokens=262144
tp b_def bert-base $S
tp b_131k bert-base $S max_tokens=131072,min_tokens=65536
tp b_pin bert-base $S "" PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8
(cd $G/split && PYTHONPATH=$P timeout 120 python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/encoding/test_packed.py 2>&1 | grep -E "passed|failed|Error" | tail -3)
tp b_split bert-base $P
for job in head split; do Q=$S; [ $job = split ] && Q=$P
echo "long_$job: $(PYTHONPATH=$Q timeout 90 python3 $G/long_probe.py 2>&1 | grep -E 'long paragraphs|Error' | tail -1)"
done
tp m_def2 minilm-l6 $S
tp m_131k2 minilm-l6 $S max_tokens=131072,min_tokens=131072
tp m_262k2 minilm-l6 $S max_tokens=262144,min_tokens=262144
tp b_def2 bert-base $S
tp b_131k2 bert-base $S max_tokens=131072,min_tokens=65536
rm -f $OUT/err.txt
