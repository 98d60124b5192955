# Session 19, call c (nvidia-h100-x2): goal 3 re-measured after session 18's worker-count change (auto_processes:
# min(12, share - 4); a rank of a 2-GPU, 32-core host now starts 12 tokenisation workers instead of 8). Same command as
# ngpu_02a5737_2xH200/run.sh (1M synthetic sentences, random BERT-base bf16, default shards), two rounds.
# Rule fixed before the call: goal 3 stays "met" if the end-to-end 2-GPU efficiency is >= 0.9 in both rounds and the
# 2-GPU store is identical to the 1-GPU store; otherwise the efficiency is reported as not met with the numbers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; echo commit $(cat .speed/gpu/commit)
W=/tmp/work
for r in 1 2; do
  t1=$(date +%s)
  timeout 240 python3 benchmarks/distributed_encode.py --vocab .speed/gpu/tok/vocab.txt --out $OUT/round$r --work $W --nprocs 1,2 --sentences 1000000 > $OUT/log$r.txt 2>&1
  echo "== round $r rc=$? took $(( $(date +%s) - t1 )) s"
  python3 - $OUT/round$r/distributed_encode.json <<'P' || tail -5 $OUT/log$r.txt
import json, sys
d = json.load(open(sys.argv[1])); print(d.get('card'), 'shard', d.get('shard_size'), 'threads/rank', d.get('torch_threads_per_rank'))
for n, r in d['runs'].items(): print(n, {k: r.get(k) for k in ('rows_per_second', 'steady_rows_per_second', 'identical_to_1', 'efficiency')})
print(d.get('scaling'))
P
  rm -rf $W/*store* 2>/dev/null
done
cd $OUT && tar czf results.tgz round* log*.txt; rm -rf round* log*.txt; ls
