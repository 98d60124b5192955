# Session 18, call d: the new automatic worker count (share of cores less 4, at most 12: 12 here) against the old one
# (tokenize_processes=8), three interleaved MiniLM-L6 pairs of five timed passes each (goal 2: min / median / max over
# >= 5 rounds) and one BERT-base pair; then the timeline probe of the new defaults (its output to a file). No new rule:
# call c's rule already made the change; this call reports it.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/thirteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
python3 -c "import sys; sys.path.insert(0, '$S'); from bertflow.encoding.tokenizer_pool import auto_processes; print('auto processes', auto_processes('cuda'))"
tp() { # tag arch settings
  PYTHONPATH=$S:$B timeout 170 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --settings $3 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    c = r["counters"]
    print(f"{sys.argv[2]:>8} {d['settings']:>22} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} waits {[round(x['main_chunk_wait_s']*1e3) for x in c]} ms ruler {r.get('ruler_ms')}")
PY
}
tp m_new1 minilm-l6 default; tp m_old1 minilm-l6 tokenize_processes=8
tp m_old2 minilm-l6 tokenize_processes=8; tp m_new2 minilm-l6 default
tp m_new3 minilm-l6 default; tp m_old3 minilm-l6 tokenize_processes=8
tp b_old1 bert-base tokenize_processes=8; tp b_new1 bert-base default
(cd $G && timeout 120 python3 $R/timeline_probe.py minilm-l6 > $OUT/timeline_default.txt 2>&1; tail -1 $OUT/timeline_default.txt)
cd $OUT && tar czf results.tgz *.json err_*.txt timeline_default.txt 2>/dev/null; rm -f *.json err_*.txt timeline_default.txt; ls
