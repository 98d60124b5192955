# Session 16, call i: MiniLM-L6 with forward batches of up to 524,288 padded tokens instead of the default 262,144
# (--settings max_tokens=524288): a 16,384-sentence chunk in one batch instead of two, so fewer launches (each batch
# costs the main thread ~7 ms, call e). Six pairs of processes, order alternating, the ruler beside every pass.
# Rule fixed before the call: worth making the default for narrow models only if the larger batches win at least 5
# of the 6 pairs on the first pass and their warm median is at least 5% higher, in passes of the same ruler state.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag settings
  PYTHONPATH=$S:$B timeout 120 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --ruler --settings "$2" --json $OUT/tp.json > /dev/null 2>$OUT/err.txt || tail -3 $OUT/err.txt
  python3 -c "import json; d=json.load(open('$OUT/tp.json')); r=d['runs']['minilm-l6']; print('$1', r['rounds'], r['ruler_ms'])" || true
  rm -f $OUT/tp.json
}
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then tp def_$i default; tp big_$i max_tokens=524288; else tp big_$i max_tokens=524288; tp def_$i default; fi
done
rm -f $OUT/err.txt
