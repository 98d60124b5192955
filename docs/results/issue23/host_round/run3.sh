export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
(cd $N && PYTHONPATH=$N/src:$B timeout 240 python3 $B/gpu_checks.py tests --commit 3ba888e --json $OUT/cuda_tests_3ba888e.json 2>&1 | grep -E '"(passed|failure|error|skipped)"|exit_status' | head)
tl() { PYTHONPATH=$1:$B timeout $2 python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs $3 --settings "$4" --out-dir $OUT --json $OUT/timeline_$5.json 2>&1 | grep -v -i "warn\|Writing" | cut -c1-420; }
tl $N/src 200 minilm-l6 "default;fast_switch=null;min_tokens=65536;max_tokens=131072,min_tokens=131072;min_tokens=65536,min_length_ratio=0.8,uniform_fill=2.0;fast_switch=null;default" new_minilm
tl $N/src 120 bert-base "default;fast_switch=null;min_tokens=65536;default" new_bert
tl $G/old/src 60 minilm-l6 "default;default" old_minilm
