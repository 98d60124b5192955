export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
v() { # label archs variants timeout
  PYTHONPATH=$N/src:$B timeout $4 python3 $B/first_pass_gpu.py variants --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --variants $3 --rounds 3 --timeout 90 --json $OUT/variants_$1.json 2>&1 | grep '^{' | cut -c1-400
}
v bert bert-base base,first_chunk=16384,first_chunk=65536 170
v minilm minilm-l6 base,first_chunk=16384 110
