export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # label src arch
  PYTHONPATH=$2:$B python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs $3 --json /tmp/tp.json >/dev/null 2>&1
  python3 -c "import json;d=json.load(open('/tmp/tp.json'));d['label']='$1';print(json.dumps(d),file=open('$OUT/throughput.jsonl','a'));print('$1',{a:(r['first_pass_sentences_per_s'],r['warm_sentences_per_s'],r['rounds']) for a,r in d['runs'].items()})"
}
tp old $G/old/src minilm-l6
tp new $N/src minilm-l6
tp old $G/old/src bert-base
tp new $N/src bert-base
tp new $N/src minilm-l6
tp old $G/old/src minilm-l6
V="default;uniform_fill=2.0;uniform_fill=2.0,min_length_ratio=0.8;uniform_fill=2.0,min_length_ratio=0.8,max_tokens=131072;switch=0.0005;uniform_fill=2.0,min_length_ratio=0.8,switch=0.0005;default"
for a in minilm-l6 bert-base; do
  PYTHONPATH=$N/src:$B python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs $a --settings "$V" --roundtrip --out-dir $OUT --json $OUT/timeline_new_$a.json 2>&1 | grep -v -i "warn\|Writing"
done
PYTHONPATH=$G/old/src:$B python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs minilm-l6 --settings "default;default" --roundtrip --out-dir $OUT --json $OUT/timeline_old_minilm.json 2>&1 | grep -v -i "warn\|Writing"
cd $N && PYTHONPATH=$N/src:$B timeout 200 python3 $B/gpu_checks.py tests --commit 9d755c2 --json $OUT/cuda_tests.json 2>&1 | grep -E '"(passed|failure|error|skipped)"|exit_status' | head
