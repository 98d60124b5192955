export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
(cd $N && PYTHONPATH=$N/src timeout 150 python3 -m pytest -x -q -p no:cacheprovider tests/encoding/test_graphs.py 2>&1 | tail -25)
v() { # label src archs variants
  PYTHONPATH=$2:$B timeout $5 python3 $B/first_pass_gpu.py variants --tokenizer-dir $G/tok --data-dir $G/sts --archs $3 --variants $4 --rounds 3 --timeout 110 --json $OUT/variants_$1.json 2>&1 | grep '^{' | cut -c1-700
}
v new_minilm $N/src minilm-l6 base,cuda_graphs=0,warm_up=1 330
v old_minilm $G/old/src minilm-l6 base 110
v new_bert $N/src bert-base warm_up=1,cuda_graphs=1 220
