# Session 17, call g: the CUDA tests nearest the default change (graphs on for narrow models), on the final code.
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$S:$B:$PWD timeout 230 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) \
  --test-files tests/encoding/test_graphs.py,tests/encoding/test_packed.py,tests/encoding/test_stream.py,tests/encoding/test_warmup.py,tests/encoding/test_fused.py,tests/calibrators/test_device.py \
  --json $OUT/cuda_tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 - $OUT/cuda_tests.json <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); print("tests", d["counts"], d["exit_status"]); print(d["not_passed"])
print(d["tail"][-1200:])
PY
