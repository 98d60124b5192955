export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 -c "import torch;print(torch.__version__)"
PYTHONPATH=$N/src:$B timeout 100 python3 $B/first_pass_gpu.py graphs --tokenizer-dir $G/tok --data-dir $G/sts --json $OUT/graphs.json 2>&1 | tail -4
PYTHONPATH=$N/src:$B timeout 420 python3 $B/first_pass_gpu.py variants --tokenizer-dir $G/tok --data-dir $G/sts --variants base,reserve,synth12288,synth28672,eager,base --json $OUT/variants.json 2>&1 | cut -c1-600
