# Session 14, call b: GEMM host cost at new token counts (gemm_probe), and pass_probe again (a stall dump armed
# after each finish), with the default 20k and an 80k warm-up. Working tree = b073a68.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; S=$PWD/src
echo "commit $(cat $G/commit)"
timeout 120 python3 $G/gemm_probe.py
PYTHONPATH=$S PROBE_PASSES=2 timeout 120 python3 $G/pass_probe.py minilm-l6 2>&1 | grep -v shards
PYTHONPATH=$S PROBE_PASSES=2 PROBE_WARM=80000 timeout 120 python3 $G/pass_probe.py minilm-l6 2>&1 | grep -v shards
