export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
v() { # label archs variants timeout
  PYTHONPATH=$PWD/src:$B timeout $4 python3 $B/first_pass_gpu.py variants --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --variants $3 --rounds 3 --timeout 80 --json $OUT/variants_${C}_$1.json 2>&1 | grep '^{' | cut -c1-600
}
v bert bert-base base,first_chunk=2048,first_chunk=1024 200
v minilm minilm-l6 base,first_chunk=2048,tokenize_processes=12 200
for a in bert-base minilm-l6; do for s in old:$G/old/src new:$PWD/src; do
PYTHONPATH=${s#*:}:$B timeout 60 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 --json $OUT/tp_${C}_${a}_${s%%:*}.json > /dev/null 2>&1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], d['file'], {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp_${C}_${a}_${s%%:*}.json
done; done
