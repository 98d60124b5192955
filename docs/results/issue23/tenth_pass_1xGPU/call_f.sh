# Session 15, call f: does the per-process swing come from where the tokeniser workers run? MiniLM-L6 first pass,
# main (fcfb61f) against the same code with every worker process on the upper half of the cores (variant.py pinw),
# six pairs, order alternating. Rule fixed before the call: worth building only if pinw wins >= 5 of the 6 pairs
# and its lowest first pass is above main's median.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag variant
  PYTHONPATH=$S:$B timeout 90 python3 $G/variant.py $2 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then tp def_$i def; tp pinw_$i pinw; else tp pinw_$i pinw; tp def_$i def; fi
done
rm -f $OUT/err.txt
