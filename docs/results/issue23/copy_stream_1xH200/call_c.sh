# Session 14, call c: pinned allocations and device allocations inside each launch of a first pass, and the same
# with every chunk's pinned output taken from one size class (PROBE_PIN_TOP). Working tree = b073a68.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; S=$PWD/src
for arch in minilm-l6 bert-base; do
echo "== $arch default"; PYTHONPATH=$S PROBE_PASSES=2 timeout 120 python3 $G/pass_probe.py $arch 2>&1 | grep -v shards | grep "pass\|launch\|device per"
echo "== $arch PIN_TOP"; PYTHONPATH=$S PROBE_PASSES=2 PROBE_PIN_TOP=1 timeout 120 python3 $G/pass_probe.py $arch 2>&1 | grep -v shards | grep "pass\|launch\|device per"
done
