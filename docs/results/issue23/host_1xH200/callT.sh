export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
lscpu | grep -E "Model name|MHz"
PYTHONPATH=$PWD/src timeout 120 python3 $G/pool_probe.py 8
