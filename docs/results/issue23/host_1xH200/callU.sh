# GIL switch interval: default 5 ms against 0.5 ms and 1 ms (throughput, two processes each, interleaved), timeline at 0.5 ms.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
tp() { # tag arch interval
  PYTHONPATH=$S:$B timeout 70 python3 $G/si.py $3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2; do
tp m_si5ms_$i minilm-l6 0.005
tp m_si05ms_$i minilm-l6 0.0005
tp m_si1ms_$i minilm-l6 0.001
done
tp b_si5ms bert-base 0.005
tp b_si05ms bert-base 0.0005
PYTHONPATH=$S:$B timeout 120 python3 $G/si.py 0.0005 $B/encode_profile_gpu.py timeline --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --settings default --out-dir $OUT --json $OUT/timeline_minilm_si05.json 2>$OUT/err.txt | cut -c1-600 || tail -3 $OUT/err.txt
rm -f $OUT/err.txt
