# Session 16, call j: chunks collected on a thread of their own (collector_variant.py: the main thread launches and
# never waits in ModelRunner.finish) against main, the ruler beside every pass. MiniLM-L6 five pairs, BERT-base two,
# order alternating. Rule fixed before the call: worth building only if the collector wins at least 4 of the 5
# MiniLM-L6 first-pass pairs with a warm median at least 8% higher, and BERT-base does not lose both of its pairs.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/eleventh_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag variant arch
  PYTHONPATH=$S:$B timeout 120 python3 $R/collector_variant.py $2 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $3 --rounds 3 --ruler --json $OUT/tp.json > /dev/null 2>$OUT/err.txt || tail -3 $OUT/err.txt
  python3 -c "import json; d=json.load(open('$OUT/tp.json')); r=d['runs']['$3']; print('$1', r['rounds'], r['ruler_ms'])" || true
  rm -f $OUT/tp.json
}
for i in 1 2 3 4 5; do
  if [ $((i % 2)) = 1 ]; then tp def_$i def minilm-l6; tp col_$i collector minilm-l6; else tp col_$i collector minilm-l6; tp def_$i def minilm-l6; fi
done
tp bdef_1 def bert-base; tp bcol_1 collector bert-base; tp bcol_2 collector bert-base; tp bdef_2 def bert-base
rm -f $OUT/err.txt
