# Run in session 19 as fourteenth_pass_1xGPU/call_a.sh (BERT-base pairs 1 and 2; the third was not needed: the rule
# had failed in the first) and call_b.sh (the MiniLM-L6 pairs). The plan, as fixed in session 18:
# Uses gpu_checks.py throughput --pair (two encoders in one process, passes alternating, order flipping each round).
# Rules fixed now, before any of it runs:
#   1. BERT-base with graphs (the final design, never measured on BERT-base): graphs become the default for 768-wide
#      models (settings.GRAPHS_MAX_HIDDEN) if the graphed side's first pass beats the eager side's in 3 of 3
#      processes and its warm median is higher in at least 2 of 3.
#   2. MiniLM-L6 first_chunk=2048: the default first chunk becomes 2,048 if it wins the first pass in 2 of 2 and the
#      warm median in 2 of 2.
#   3. MiniLM-L6 tokenize_processes=14: MAX_AUTO_PROCESSES stays 12 unless 14 wins 2 of 2 first passes by 3% or more.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag arch pair order
  PYTHONPATH=$S:$B timeout 200 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --pair $3 --pair-order $4 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d["runs"].items():
    print(f"{sys.argv[2]:>8} {name:>16} {r.get('settings', 'defaults'):>22} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} ruler {r.get('ruler_ms')}")
PY
}
tp b_g1 bert-base graphs=true ab; tp b_g2 bert-base graphs=true ba; tp b_g3 bert-base graphs=true ab
tp m_f1 minilm-l6 first_chunk=2048 ab; tp m_f2 minilm-l6 first_chunk=2048 ba
tp m_p1 minilm-l6 tokenize_processes=14 ba; tp m_p2 minilm-l6 tokenize_processes=14 ab
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
