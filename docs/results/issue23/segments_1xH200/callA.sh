export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$PWD/src timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/encoding/test_packed.py 2>&1 | grep -E "passed|failed|Error|error" | tail -15
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/encode_profile_gpu.py forward --tokenizer-dir $G/tok --data-dir $G/sts --archs bert-base,minilm-l6 --variants slotted:fused-gelu,segments:fused-gelu --profile none --rounds 3 --out-dir $OUT --json $OUT/forward_$C.json 2>&1 | grep -v Writing | tail -12
i=0
for a in bert-base minilm-l6; do for job in old new seg seggreedy; do i=$((i+1)); P=$PWD/src; X=""
[ $job = old ] && P=$G/old/src
[ $job = seg ] && X="--variant segments:fused-gelu"
[ $job = seggreedy ] && X="--variant segments:fused-gelu --settings min_length_ratio=0,min_tokens=0"
PYTHONPATH=$P:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 $X --json $OUT/tp_${C}_${i}_${a}_${job}.json > /dev/null 2>$OUT/err_$i.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp_${C}_${i}_${a}_${job}.json || tail -3 $OUT/err_$i.txt
done; done
