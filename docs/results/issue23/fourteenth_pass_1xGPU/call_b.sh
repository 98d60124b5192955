# Session 19, call b (same machine as call a, kept warm): the MiniLM-L6 pairs that thirteenth_pass_1xGPU/next_call.sh
# planned, rules unchanged (fixed in session 18):
#   first_chunk=2048: the default first chunk becomes 2,048 if it wins the first pass in 2 of 2 and the warm median
#   in 2 of 2.  tokenize_processes=14: MAX_AUTO_PROCESSES stays 12 unless 14 wins 2 of 2 first passes by 3% or more.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag arch pair order
  t1=$(date +%s)
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --pair $3 --pair-order $4 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d["runs"].items():
    print(f"{sys.argv[2]:>8} {name:>16} {r.get('settings', 'defaults'):>22} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
PY
  echo $1 took $(( $(date +%s) - t1 )) s
}
tp m_f1 minilm-l6 first_chunk=2048 ab; tp m_f2 minilm-l6 first_chunk=2048 ba
tp m_p1 minilm-l6 tokenize_processes=14 ba; tp m_p2 minilm-l6 tokenize_processes=14 ab
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
