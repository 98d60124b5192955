export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
(cd $N && PYTHONPATH=$N/src:$B timeout 220 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E '"(passed|failed|failures|errors|error|skipped)"|exit_status' | head -8)
tp() { # label src arch
  rm -f /tmp/tp.json
  PYTHONPATH=$2:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs $3 --json /tmp/tp.json >/dev/null 2>&1
  python3 -c "import json;d=json.load(open('/tmp/tp.json'));d['label']='$1';d['pythonpath']='$2';print(json.dumps(d),file=open('$OUT/throughput.jsonl','a'));print('$1',{a:(r['first_pass_sentences_per_s'],r['warm_sentences_per_s'],r['rounds']) for a,r in d['runs'].items()})"
}
tp new $N/src minilm-l6
tp old $G/old/src minilm-l6
tp new $N/src bert-base
tp old $G/old/src bert-base
v() { # label archs variants timeout
  PYTHONPATH=$N/src:$B timeout $4 python3 $B/first_pass_gpu.py variants --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --variants $3 --rounds 3 --timeout 60 --json $OUT/variants_$1.json 2>&1 | grep '^{' | cut -c1-420
}
v minilm minilm-l6 warm_up=0,base,cuda_graphs=1 150
v bert bert-base warm_up=0,base 100
