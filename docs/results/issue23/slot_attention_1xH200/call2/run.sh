export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$PWD/src timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/encoding/test_packed.py 2>&1 | tail -25
PYTHONPATH=$PWD/src:$B timeout 120 python3 $B/encode_profile_gpu.py forward --tokenizer-dir $G/tok --data-dir $G/sts --archs bert-base,minilm-l6 --variants slotted-sdpa:fused-gelu,slotted:fused-gelu --profile slotted:fused-gelu --rounds 3 --out-dir $OUT --json $OUT/forward_$C.json 2>&1 | grep -v Writing | tail -30
for r in 1 2; do for a in bert-base minilm-l6; do for v in slotted-sdpa:fused-gelu slotted:fused-gelu; do
PYTHONPATH=$PWD/src:$B timeout 60 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 --variant $v --json $OUT/throughput_${C}_r${r}_${a}_${v%%:*}.json > /dev/null 2>&1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/throughput_${C}_r${r}_${a}_${v%%:*}.json
done; done; done
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E "passed|failed" | tail -3
