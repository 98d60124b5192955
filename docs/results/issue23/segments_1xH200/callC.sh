export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
i=0
for a in bert-base minilm-l6; do for job in old new old new old new; do i=$((i+1)); P=$PWD/src
[ $job = old ] && P=$G/old/src
PYTHONPATH=$P:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('tp_${C}_${i}_${a}_${job}', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
done; done
rm -f $OUT/tp.json $OUT/err.txt
PYTHONPATH=$PWD/src:$B timeout 120 python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --archs bert-base --rounds 6 --settings "default" --out-dir $OUT --json $OUT/timeline_$C.json 2>/dev/null | grep -v Writing | cut -c1-900
python3 - $OUT/timeline_$C.json <<'PY'
import json,sys,statistics
d=json.load(open(sys.argv[1]))
for name, run in d["runs"].items():
    walls=[p["wall_s"] for p in run["passes"]]
    med=statistics.median(walls[1:])
    for j,p in enumerate(run["passes"]):
        if j==0 or p["wall_s"]>1.3*med:
            print("PASS", j, p["wall_s"], "busy", p["gpu_busy_s"], "last_end", p["gpu_last_end_s"])
            for r in p["timeline"]:
                print("  ", {k: r[k] for k in r if k in ("what","row","n","batches","t0","t1","gpu0","gpu1","thread")})
PY
PYTHONPATH=$PWD/src:$B timeout 200 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E "passed|failed" | tail -3
