export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 $G/shape_probe.py
i=0
for a in bert-base minilm-l6; do
[ $a = bert-base ] && L="1 256 1024 4096 1 256 1024 4096" || L="1 1024 1 1024"
for bk in $L; do i=$((i+1))
PYTHONPATH=$PWD/src:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $a --rounds 3 --bucket $bk --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('tp_${C}_${i}_${a}_bucket${bk}', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
done; done
rm -f $OUT/tp.json $OUT/err.txt
