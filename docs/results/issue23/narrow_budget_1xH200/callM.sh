export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag arch src settings
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
S=$PWD/src
for i in 1 2; do for a in minilm-l6 bert-base; do
tp ${a}_4096_$i $a $S
tp ${a}_2048_$i $a $S first_chunk=2048
tp ${a}_1024_$i $a $S first_chunk=1024
done; done
rm -f $OUT/err.txt
