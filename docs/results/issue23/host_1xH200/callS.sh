# Session 13, first call: CUDA tests of the final code (never ran on a card), throughput per arch, timelines.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(git rev-parse --short HEAD 2>/dev/null || cat $G/commit)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; nproc; lscpu | grep "Model name"
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_H200_$C.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['commit'], d['counts'], d['not_passed'])" $OUT/cuda_tests_H200_$C.json
tp() { # tag arch src settings
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
S=$PWD/src
tp m1 minilm-l6 $S
tp b1 bert-base $S
PYTHONPATH=$S:$B timeout 120 python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --settings default --cprofile --out-dir $OUT --json $OUT/timeline_minilm.json 2>$OUT/err.txt | cut -c1-1500 || tail -3 $OUT/err.txt
tp m2 minilm-l6 $S
rm -f $OUT/err.txt
