export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
i=0
for a in bert-base minilm-l6; do
[ $a = bert-base ] && L="old new fc1024 old new fc1024" || L="old new fc1024 fc2048 old new fc1024 fc2048"
for job in $L; do i=$((i+1)); P=$PWD/src; X=""
[ $job = old ] && P=$G/old/src
[ $job = fc1024 ] && X="--settings first_chunk=1024"
[ $job = fc2048 ] && X="--settings first_chunk=2048"
PYTHONPATH=$P:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 $X --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('tp_${C}_${i}_${a}_${job}', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
done; done
rm -f $OUT/tp.json $OUT/err.txt
PYTHONPATH=$PWD/src:$B timeout 120 python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6,bert-base --rounds 4 --settings "default" --out-dir $OUT --json $OUT/timeline_$C.json 2>/dev/null | grep -v Writing | cut -c1-700
PYTHONPATH=$PWD/src:$B timeout 200 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests_$C.json 2>&1 | grep -E "passed|failed" | tail -2
