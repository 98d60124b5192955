export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
for job in minilm-l6:new minilm-l6:old bert-base:new bert-base:old minilm-l6:new minilm-l6:old bert-base:new bert-base:old; do a=${job%%:*}; s=${job#*:}; i=$((i+1))
if [ $s = old ]; then P=$G/old/src; else P=$PWD/src; fi
PYTHONPATH=$P:$B timeout 60 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 --json $OUT/tp_${C}_${i}_${a}_${s}.json > /dev/null 2>&1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp_${C}_${i}_${a}_${s}.json
done
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E "passed|failed" | tail -2
