export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # tag arch src settings
  PYTHONPATH=$3:$B timeout 70 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 ${4:+--settings $4} --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
S=$PWD/src; O=$G/base/src
for i in 1 2; do
tp m_base$i minilm-l6 $O
tp m_new$i minilm-l6 $S
tp m_524k$i minilm-l6 $S max_tokens=524288
done
tp m_base_pad minilm-l6 $O unpadded=false
tp m_new_pad minilm-l6 $S unpadded=false
PYTHONPATH=$S:$B timeout 150 python3 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --settings default --cprofile --out-dir $OUT --json $OUT/timeline_minilm.json 2>$OUT/err.txt | cut -c1-1500 || tail -3 $OUT/err.txt
rm -f $OUT/err.txt
