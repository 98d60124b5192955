export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"
export PYTHONPATH=$G/new/src:$G/bench
python3 $G/worker_speed.py 2>&1 | tee $OUT/worker_speed.txt
python3 $G/bench/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --rounds 3 --archs minilm-l6,bert-base --settings "default;max_tokens=131072;tokenize_processes=12;switch=0.0005;first_chunk=2048;tokenize_workers=3" --cprofile --out-dir $OUT --json $OUT/timeline.json 2>&1 | grep -v -i warn
