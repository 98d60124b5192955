# First call of the next session: CUDA tests of the final code (the slot kernel's removal, bd79e0d, never ran on a
# card), then one throughput process per arch. Carry .speed/gpu (tok/, sts/; commit holds the commit under test).
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(git rev-parse --short HEAD 2>/dev/null || cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_H200_$C.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['commit'], d['counts'], d['not_passed'])" $OUT/cuda_tests_H200_$C.json
PYTHONPATH=$PWD/src:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6,bert-base --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('tp_$C', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
rm -f $OUT/tp.json $OUT/err.txt
