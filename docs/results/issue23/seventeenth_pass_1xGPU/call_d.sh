# Session 22, call d: where call c's gap comes from. Same benchmark at 1,000,000 lines instead of 500,000 (same code,
# b9453cb; the shards stay 32,768 rows by default). Diagnostic only: goal 3 is still read at 500,000 lines (call c).
# Reading fixed before the call: if the ratio at 1M is at least 0.9, most of the 500k gap is a fixed cost per job
# (the rank's start inside its timed phase, its first shard on text it has not seen); if it stays near 0.897, the
# gap is per row (shard writing, reading, the rank's pipeline).
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; C=$(cat $G/commit)
echo commit $C; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
PYTHONPATH=$S:$B timeout 500 python3 $B/gpu_checks.py scaleout --tokenizer-dir $G/tok --data-dir $G/sts --rows 1000000 --rounds 2 --json $OUT/scaleout.json > /dev/null 2>$OUT/err.txt || tail -5 $OUT/err.txt
python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], {k: d[k] for k in ('embedder_encode_rows_per_s','embedder_encode_same_chunks_rows_per_s','distributed_encode_rows_per_s','ratio_distributed_over_embedder','ratio_distributed_over_embedder_same_chunks','store_equals_embedder_encode_same_chunks')}, [j['summary']['rows_per_second'] for j in d['jobs']])" $OUT/scaleout.json
python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); j=d['jobs'][0]['summary']; print({k: v for k, v in j.items() if 'shard' in k or 'second' in k})" $OUT/scaleout.json
