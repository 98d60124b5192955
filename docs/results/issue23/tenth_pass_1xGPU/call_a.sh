# Session 15, call a: host-side variants of the MiniLM-L6 first pass (variant.py), interleaved, rotating order.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node" ; python3 -c "import sys,torch;print(sys.version.split()[0], torch.__version__)"
tp() { # tag arch variants
  PYTHONPATH=$S:$B timeout 90 python3 $G/variant.py $3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
V=(def nocheck nopin)
for i in 0 1 2 3; do
  for j in 0 1 2; do v=${V[$(( (i + j) % 3 ))]}; tp m_${v}_$i minilm-l6 $v; done
done
tp b_def bert-base def; tp b_nocheck bert-base nocheck
rm -f $OUT/err.txt
