# Session 18, call b: where a graphed MiniLM-L6 pass waits for chunks. (1) timeline_probe.py: each chunk's events in
# one process with the defaults, one with 12 tokenisation processes, one eager (graphs=false; also the first encode's
# time and the memory held, graphs against none). (2) interleaved throughput, two rounds of: the defaults,
# tokenize_processes=12, tokenize_workers=3. No rule: this call looks, to choose what to change.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/thirteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
probe() { echo "== probe $1"; (cd $G && timeout 120 python3 $R/timeline_probe.py minilm-l6 $1 2>&1 | tail -120); }
probe graphs=true; probe tokenize_processes=12; probe graphs=false
tp() { # tag settings
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --ruler --counters --settings $2 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    print(f"{sys.argv[2]:>10} {d['settings']} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
    for rate, c in zip(r["rounds"], r["counters"]):
        print(f"    {rate/1e3:6.1f}k main cpu {c['main_cpu_s']:.3f}s chunk wait {c['main_chunk_wait_s']:.3f}s chunks {c['chunks']} workers {c['worker_cpu_s']:.2f}s proc {c['process_cpu_s']:.2f}s")
PY
}
for i in 1 2; do tp def$i default; tp p12_$i tokenize_processes=12; tp w3_$i tokenize_workers=3; done
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
