export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_2026-11-27_H200_$C.json 2>&1 | grep -E "passed|failed" | tail -2
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k not in ('tests', 'outcomes')}); print([n for n, o in d.get('outcomes', d.get('tests', {})).items() if o not in ('passed', 'skipped')])" $OUT/cuda_tests_2026-11-27_H200_$C.json
PYTHONPATH=$PWD/src:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6,bert-base --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('final_$C', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
rm -f $OUT/tp.json $OUT/err.txt
