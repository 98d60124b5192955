#!/bin/bash
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/work
for s in default 65536; do
  if [ $s = default ]; then a=""; else a="--shard-size $s"; fi
  timeout 200 python3 benchmarks/distributed_encode.py --vocab .speed/gpu/tok/vocab.txt --out $OUT/$s.$RANDOM --work $W --nprocs 1,2 --sentences 1000000 $a > /tmp/log.txt 2>&1
  echo "== shard $s rc=$?"
  python3 - <<'P'
import json,glob,os
f=max(glob.glob(os.environ['OUT']+'/*/distributed_encode.json'),key=os.path.getmtime)
d=json.load(open(f)); print(f, d.get('shard_size'))
for n,r in d['runs'].items(): print(n,{k:r.get(k) for k in ('rows_per_second','steady_rows_per_second','identical_to_1','efficiency','scaling_efficiency')})
print({k:v for k,v in d.items() if 'eff' in k})
P
  tail -3 /tmp/log.txt
done
