export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
(cd $N && PYTHONPATH=$N/src:$B timeout 220 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E '"(passed|failed|failures|errors|error|skipped)"|exit_status' | head -8)
v() { # label archs variants timeout
  PYTHONPATH=$N/src:$B timeout $4 python3 $B/first_pass_gpu.py variants --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --variants $3 --rounds 3 --timeout 60 --json $OUT/variants_$1.json 2>&1 | grep '^{' | cut -c1-330
}
v minilm minilm-l6 warm_up=1,warm_up=0 100
v bert bert-base warm_up=1,warm_up=0 100
