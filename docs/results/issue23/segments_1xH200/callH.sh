export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
i=0
for a in bert-base minilm-l6; do for job in old:20000 new:20000 old:40000 new:40000 old:20000 new:20000 old:40000 new:40000; do i=$((i+1)); s=${job%%:*}; w=${job#*:}; P=$PWD/src
[ $s = old ] && P=$G/old/src
PYTHONPATH=$P:$B timeout 80 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 --warmup $w --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('tp_${C}_${i}_${a}_${s}_warmup${w}', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
done; done
rm -f $OUT/tp.json $OUT/err.txt
PYTHONPATH=$PWD/src:$B timeout 200 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E "passed|failed" | tail -2
