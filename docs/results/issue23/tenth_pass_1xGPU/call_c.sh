# Session 15, call c: goal 3 re-measured after the copy-stream change (078e760): distributed-encode on one GPU
# against Embedder.encode, 500k STS lines, 2 rounds, main's code (fcfb61f).
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$S:$B timeout 500 python3 $B/gpu_checks.py scaleout --tokenizer-dir $G/tok --data-dir $G/sts --rows 500000 --rounds 2 --json $OUT/scaleout.json > $OUT/scaleout.log 2>&1; echo rc $?
python3 -c "
import json; d = json.load(open('$OUT/scaleout.json'))
print({k: d[k] for k in ('card', 'arch', 'rows', 'embedder_encode_rows_per_s', 'embedder_encode_seconds', 'distributed_encode_rows_per_s', 'ratio_distributed_over_embedder', 'store_equals_embedder_encode_same_chunks') if k in d})
for j in d.get('jobs', []): r = j['summary']['per_rank'][0]; print(j['wall_s'], r['seconds'], r['shard_seconds'], r.get('warmup_seconds'))
" || tail -20 $OUT/scaleout.log
