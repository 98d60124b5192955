# Session 14, call e: the abandoned-stream thread test on the card (alone and after the other CUDA files), for
# b073a68 (base14/) and the working tree; the pass probe on the working tree.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; S=$PWD/src; H=$G/base14/src
cp tests/encoding/test_stream.py /tmp/ts.py
for src in $H $S; do
echo "== $src alone"; PYTHONPATH=$src timeout 100 python3 -m pytest -q -p no:cacheprovider tests/encoding/test_stream.py -k abandoned 2>&1 | grep -E "passed|failed|Error|assert" | head -5
echo "== $src after tokenization"; PYTHONPATH=$src timeout 200 python3 -m pytest -q -p no:cacheprovider tests/encoding/test_tokenization.py tests/encoding/test_stream.py -k "abandoned or pool or worker or thread" 2>&1 | grep -E "passed|failed|Error|assert" | head -8
done
for arch in minilm-l6 bert-base; do
echo "== $arch new"; PYTHONPATH=$S PROBE_PASSES=2 timeout 120 python3 $G/pass_probe.py $arch 2>&1 | grep -v shards | grep "pass\|launch\|finish\|device per"
done
