# Session 18, call e: a shorter thread switch interval while the chunk pipeline runs (0.1 ms against the library's
# 0.5 ms). Call d's timeline: sending the first chunk's 12 parts to the workers took 12 ms, about 24 writes each
# waiting up to one switch interval for the GIL. Rule fixed before the call: FAST_SWITCH_INTERVAL becomes 0.1 ms if
# its MiniLM-L6 first pass beats the library's in 3 of 3 interleaved pairs with a higher warm median, and BERT-base's
# first pass (one pair) is not lower by more than 5%.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/thirteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag arch interval
  PYTHONPATH=$S:$B timeout 150 python3 $R/switch_variant.py $3 throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 $3 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    c = r["counters"]
    print(f"{sys.argv[2]:>8} switch {sys.argv[3]:>6} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} waits {[round(x['main_chunk_wait_s']*1e3) for x in c]} ms ruler {r.get('ruler_ms')}")
PY
}
tp m_s1_1 minilm-l6 0.0001; tp m_s5_1 minilm-l6 0.0005
tp m_s5_2 minilm-l6 0.0005; tp m_s1_2 minilm-l6 0.0001
tp m_s1_3 minilm-l6 0.0001; tp m_s5_3 minilm-l6 0.0005
tp b_s5_1 bert-base 0.0005; tp b_s1_1 bert-base 0.0001
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
