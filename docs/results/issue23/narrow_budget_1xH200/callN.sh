export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
tp() { # tag arch src settings
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
S=$PWD/src
for i in 1 2; do
tp m_p8w2_$i minilm-l6 $S
tp m_p12w2_$i minilm-l6 $S tokenize_processes=12
tp m_p8w3_$i minilm-l6 $S tokenize_workers=3
tp m_p12w3_$i minilm-l6 $S tokenize_processes=12,tokenize_workers=3
done
tp b_p8w2 bert-base $S
tp b_p12w3 bert-base $S tokenize_processes=12,tokenize_workers=3
rm -f $OUT/err.txt
