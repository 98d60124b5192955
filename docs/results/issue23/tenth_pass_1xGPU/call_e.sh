# Session 15, call e: MiniLM-L6 first pass, three variants interleaved in rotating order, 4 rounds:
#   base    main (fcfb61f), the feeding thread checks each chunk (batching.cut_chunks)
#   nocheck main with no check at all (variant.py nocheck): the cost of a check that needs no pass over the text
#   wcheck  10a0c35: each chunk checked in the tokeniser worker processes (call b's candidate)
# Rule fixed before this call: a check costing nothing on valid text (blank rows found from the token counts,
# errors re-checked) is built only if nocheck beats base in >= 7 of the 8 pairs of calls a and e together
# (one-sided sign test p = 0.035) and its mean over those 8 is >= 5% above base's.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag src variant
  PYTHONPATH=$2:$B timeout 90 python3 $G/variant.py $3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
run() { case $1 in base) tp base_$2 $S def;; nocheck) tp nocheck_$2 $S nocheck;; wcheck) tp wcheck_$2 $G/wcheck/src def;; esac; }
V=(base nocheck wcheck)
for i in 0 1 2 3; do for j in 0 1 2; do run ${V[$(( (i + j) % 3 ))]} $i; done; done
rm -f $OUT/err.txt
