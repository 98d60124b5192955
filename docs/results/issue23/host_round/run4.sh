export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
(cd $N && PYTHONPATH=$N/src:$B timeout 200 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E '"(passed|failure|error|skipped)"|exit_status' | head -6)
tp() { # label src arch
  PYTHONPATH=$2:$B timeout 80 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs $3 --json /tmp/tp.json >/dev/null 2>&1
  python3 -c "import json;d=json.load(open('/tmp/tp.json'));d['label']='$1';d['pythonpath']='$2';print(json.dumps(d),file=open('$OUT/throughput.jsonl','a'));print('$1',{a:(r['first_pass_sentences_per_s'],r['warm_sentences_per_s'],r['rounds']) for a,r in d['runs'].items()})"
}
tp old $G/old/src minilm-l6
tp new $N/src minilm-l6
tp old $G/old/src bert-base
tp new $N/src bert-base
tp new $N/src minilm-l6
tp old $G/old/src minilm-l6
PYTHONPATH=$N/src:$B timeout 150 python3 $B/encode_profile_gpu.py forward --tokenizer-dir $G/tok --data-dir $G/sts --rounds 2 --variants slotted:fused-gelu --profile none --out-dir $OUT --json $OUT/forward.json 2>&1 | grep -E '"(device_s|sentences_per_s|max_1_minus_cos_vs_padded_bf16|max_1_minus_cos_vs_padded_fp32|speedup_vs_padded)"' 
