# Session 16, call g: the standard throughput command with the ruler beside it (gpu_checks.py throughput --ruler
# --counters): eight MiniLM-L6 and three BERT-base processes of main, each pass's host state recorded, so that the
# goals can be read per state.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag arch
  PYTHONPATH=$S:$B timeout 120 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --counters --ruler --json $OUT/$1.json > /dev/null 2>$OUT/err.txt || tail -3 $OUT/err.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    for rate, c, ms in zip(r["rounds"], r["counters"], r["ruler_ms"]):
        print(f"{sys.argv[2]:>9} {rate/1e3:6.1f}k ruler {ms} ms  main {c['main_cpu_s']:.3f}s wait {c['main_chunk_wait_s']:.3f}s workers {c['worker_cpu_s']:.2f}s")
    print(f"{sys.argv[2]:>9} ruler over the run {d['ruler_ms_whole_run']} ms")
PY
}
for i in 1 2 3 4 5 6 7 8; do tp minilm_$i minilm-l6; done
for i in 1 2 3; do tp bert_$i bert-base; done
mkdir -p $OUT/json; mv $OUT/*.json $OUT/json/ 2>/dev/null; cd $OUT && tar czf runs.tgz json && rm -rf json err.txt
