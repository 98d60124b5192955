export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$PWD/src timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/encoding/test_packed.py 2>&1 | grep -E "passed|failed|Error |error" | tail -15
PYTHONPATH=$PWD/src:$B timeout 150 python3 $B/encode_profile_gpu.py forward --tokenizer-dir $G/tok --data-dir $G/sts --archs bert-base,minilm-l6 --variants slotted:fused-gelu,segments:fused-gelu --profile none --rounds 3 --out-dir $OUT --json $OUT/forward_$C.json > $OUT/forward_$C.log 2>&1
python3 - $OUT/forward_$C.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
def walk(x, path):
    if isinstance(x, dict):
        if "device_s" in x:
            print(path, {k: x[k] for k in x if k in ("device_s","host_queue_s","sentences_per_s","max_1_minus_cos_vs_padded_bf16","max_1_minus_cos_vs_padded_fp32","speedup_vs_padded","batches","slots","real_tokens")})
        else:
            for k, v in x.items(): walk(v, path + "/" + str(k))
walk(d, "")
PY
i=0
for a in bert-base minilm-l6; do for job in new seggreedy seg big new seggreedy seg big; do i=$((i+1)); X=""
[ $job = seg ] && X="--variant segments:fused-gelu"
[ $job = seggreedy ] && X="--variant segments:fused-gelu --settings min_length_ratio=0,min_tokens=0"
[ $job = big ] && X="--variant segments:fused-gelu --settings min_length_ratio=0,min_tokens=0,max_tokens=131072"
PYTHONPATH=$PWD/src:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 $X --json $OUT/tp_${C}_${i}_${a}_${job}.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp_${C}_${i}_${a}_${job}.json || tail -3 $OUT/err.txt
done; done
rm -f $OUT/err.txt
