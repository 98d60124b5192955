export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
for job in old new; do P=$PWD/src; [ $job = old ] && P=$G/old/src
echo "$job: $(PYTHONPATH=$P timeout 80 python3 $G/long_probe.py 2>&1 | grep -E 'long paragraphs|Error' | tail -1)"
done
PYTHONPATH=$PWD/src:$B timeout 100 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E "passed|failed" | tail -2
i=0
for job in prev new; do i=$((i+1)); P=$PWD/src; [ $job = prev ] && P=$G/prev/src
PYTHONPATH=$P:$B timeout 60 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs bert-base --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('tp_${C}_${i}_bert-base_${job}', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
done
rm -f $OUT/tp.json $OUT/err.txt
