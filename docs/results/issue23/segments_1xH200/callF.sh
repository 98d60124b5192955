export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$PWD/src timeout 120 python3 .speed/gpu/first_probe.py bert-base 2>&1 | grep -v Writing | cut -c1-160
