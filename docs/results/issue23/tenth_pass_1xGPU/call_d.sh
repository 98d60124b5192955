# Session 15, call d (call c's machine): the scale-out measurement again, then main's first passes (fcfb61f):
# four MiniLM-L6 processes and two BERT-base processes.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$S:$B timeout 300 python3 $B/gpu_checks.py scaleout --tokenizer-dir $G/tok --data-dir $G/sts --rows 500000 --rounds 2 --json $OUT/scaleout.json > $OUT/scaleout.log 2>&1; echo rc $?
python3 -c "
import json; d = json.load(open('$OUT/scaleout.json'))
print({k: d[k] for k in ('card', 'arch', 'rows', 'embedder_encode_rows_per_s', 'embedder_encode_seconds', 'distributed_encode_rows_per_s', 'ratio_distributed_over_embedder', 'store_equals_embedder_encode_same_chunks') if k in d})
for j in d.get('jobs', []): r = j['summary']['per_rank'][0]; print(j['wall_s'], r['seconds'], r['shard_seconds'], r.get('warmup_seconds'))
" || tail -20 $OUT/scaleout.log
tp() { # tag arch
  PYTHONPATH=$S:$B timeout 90 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 3 --json $OUT/tp.json > /dev/null 2>$OUT/err.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$1', {k: (v['first_pass_sentences_per_s'], v['rounds']) for k, v in d['runs'].items()})" $OUT/tp.json || tail -3 $OUT/err.txt
  rm -f $OUT/tp.json
}
for i in 1 2 3 4; do tp m$i minilm-l6; done
for i in 1 2; do tp b$i bert-base; done
rm -f $OUT/err.txt
