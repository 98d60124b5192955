# Session 18, call c: more tokenisation processes, and a smaller first chunk, against the defaults. Rule fixed before
# the call: the automatic worker count becomes 12 on these 16-core machines (tokenize_processes=12) if, in the four
# interleaved MiniLM-L6 rounds, its first pass beats the defaults' in at least 3 of 4 pairs, and BERT-base's first
# pass (two pairs) is not lower by more than 5% in the median. first_chunk=2048 is added on top only if it beats
# tokenize_processes=12 alone in at least 3 of 4 pairs.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag arch settings
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --ruler --counters --settings $3 --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    c = r["counters"]
    print(f"{sys.argv[2]:>8} {d['settings']:>40} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} waits {[round(x['main_chunk_wait_s']*1e3) for x in c]} ms ruler {r.get('ruler_ms')}")
PY
}
for i in 1 2; do
  tp m_def$i minilm-l6 default; tp m_p12_$i minilm-l6 tokenize_processes=12; tp m_p12f_$i minilm-l6 tokenize_processes=12,first_chunk=2048
  tp b_def$i bert-base default; tp b_p12_$i bert-base tokenize_processes=12
done
for i in 3 4; do
  tp m_p12f_$i minilm-l6 tokenize_processes=12,first_chunk=2048; tp m_p12_$i minilm-l6 tokenize_processes=12; tp m_def$i minilm-l6 default
done
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
