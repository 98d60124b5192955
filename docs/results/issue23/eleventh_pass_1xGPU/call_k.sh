# Session 16, call k: BERT-base with a first chunk of 1,024 sentences instead of 4,096 (--settings first_chunk=1024):
# BERT-base is bound by the device once it starts, and the device waits 20-30 ms for the first chunk. Six pairs of
# processes, order alternating, the ruler beside every pass. Rule fixed before the call: worth making the default for
# models as wide as BERT-base only if the smaller first chunk wins at least 5 of the 6 first-pass pairs with a mean
# gain of at least 3%.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag settings
  PYTHONPATH=$S:$B timeout 120 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs bert-base --rounds 2 --ruler --settings "$2" --json $OUT/tp.json > /dev/null 2>$OUT/err.txt || tail -3 $OUT/err.txt
  python3 -c "import json; d=json.load(open('$OUT/tp.json')); r=d['runs']['bert-base']; print('$1', r['rounds'], r['ruler_ms'])" || true
  rm -f $OUT/tp.json
}
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then tp def_$i default; tp small_$i first_chunk=1024; else tp small_$i first_chunk=1024; tp def_$i default; fi
done
rm -f $OUT/err.txt
