export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu
N=$G/new
B=$N/benchmarks
C=$(cat $G/commit)
nvidia-smi --query-gpu=name --format=csv,noheader
tp() { # label src arch
  PYTHONPATH=$2:$B timeout 170 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --rounds 5 --archs $3 --json /tmp/tp.json >/dev/null 2>&1
  python3 -c "import json;d=json.load(open('/tmp/tp.json'));d['label']='$1';d['pythonpath']='$2';print(json.dumps(d),file=open('$OUT/throughput.jsonl','a'));print('$1',{a:(r['first_pass_sentences_per_s'],r['warm_sentences_per_s'],r['rounds']) for a,r in d['runs'].items()})"
}
rm -f /tmp/tp.json; tp new $N/src bert-base
rm -f /tmp/tp.json; tp old $G/old/src bert-base
rm -f /tmp/tp.json; tp old $G/old/src minilm-l6
rm -f /tmp/tp.json; tp new $N/src minilm-l6
