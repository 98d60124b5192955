# The worker-probe call of the eighth pass (code 526810c), as run:
export PYTHONUNBUFFERED=1; PYTHONPATH=$PWD/src timeout 100 python3 .speed/gpu/worker_probe.py minilm-l6 2>&1 | grep -v shards; PYTHONPATH=$PWD/src PROBE_PASSES=2 timeout 100 python3 .speed/gpu/worker_probe.py bert-base 2>&1 | grep -v shards
