export PYTHONUNBUFFERED=1
# abandon_probe.py (copied here) needs tests/ of the checkout
PYTHONPATH=$PWD/src timeout 60 python3 .speed/gpu/abandon_probe.py 2>&1 | tail -40
