# Session 17, call f: every bucket captured at the first graphed batch. CUDA tests of test_graphs.py, then three
# interleaved MiniLM-L6 pairs, graphs on / off, --counters and the ruler. Rule fixed before the call: graphs become the
# default for models up to 512 wide if the graphed first pass wins all 3 pairs and the graphed warm median is higher.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
PYTHONPATH=$S:$B:$PWD timeout 200 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) \
  --test-files tests/encoding/test_graphs.py --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 - $OUT/tests.json <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); print("tests", d["counts"], d["exit_status"]); print(d["not_passed"])
if d["exit_status"]: print(d["tail"][-1500:])
PY
tp() { # tag arch settings
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --ruler --counters --settings $3 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    print(f"{sys.argv[2]:>14} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
    for rate, c in zip(r["rounds"], r["counters"]):
        print(f"    {rate/1e3:6.1f}k main cpu {c['main_cpu_s']:.3f}s chunk wait {c['main_chunk_wait_s']:.3f}s workers {c['worker_cpu_s']:.2f}s proc {c['process_cpu_s']:.2f}s")
PY
}
for i in 1 2; do tp minilm_g$i minilm-l6 graphs=true; tp minilm_e$i minilm-l6 graphs=false; done
tp minilm_e3 minilm-l6 graphs=false; tp minilm_g3 minilm-l6 graphs=true
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt; ls
