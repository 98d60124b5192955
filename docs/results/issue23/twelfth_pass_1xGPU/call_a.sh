# Session 17, call a: the packed forward replayed from CUDA graphs (EncodeSettings.graphs), first measurement.
# 1. CUDA tests of the changed code. 2. Interleaved pairs of processes, graphs on / off, with the ruler.
# Rule fixed before the call: graphs become the default for MiniLM-L6-wide models if the graphed first pass wins
# at least 3 of 4 MiniLM-L6 pairs and its warm median is at least 10% higher, with the CUDA tests passing.
# BERT-base: the default only if both of its pairs' first passes win and the warm passes are not slower.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
PYTHONPATH=$S:$B:$PWD timeout 300 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) \
  --test-files tests/encoding/test_graphs.py,tests/calibrators/test_device.py,tests/encoding/test_packed.py \
  --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 - $OUT/tests.json <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); print("tests", d["counts"], d["exit_status"]); print(d["not_passed"]); 
if d["exit_status"]: print(d["tail"][-1500:])
PY
tp() { # tag arch graphs
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --ruler --settings graphs=$3 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    print(f"{sys.argv[2]:>14} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
PY
}
for i in 1 2; do tp minilm_g$i minilm-l6 true; tp minilm_e$i minilm-l6 false; done
for i in 3 4; do tp minilm_e$i minilm-l6 false; tp minilm_g$i minilm-l6 true; done
tp bert_g1 bert-base true; tp bert_e1 bert-base false; tp bert_e2 bert-base false; tp bert_g2 bert-base true
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt; ls
