# Session 16, call b: where the main thread's time goes in a first pass against a warm one (py-spy, sampling every
# 1 ms without stopping the process), and whether its CPU time is work or a spinning wait for the device: the same
# probe with the context's host waits blocking (spy_probe.py blocking). MiniLM-L6 two processes each way, BERT-base one.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; R=$PWD/docs/results/issue23/eleventh_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
cd $G
spy() { # tag arch mode
  echo "== $1 ($2 $3)"
  if ./py-spy record --format speedscope -o $OUT/$1.json --idle --threads --nonblocking -r 1000 -- python3 $R/spy_probe.py $2 $3 > $OUT/p.txt 2>&1; then
    grep -E '^\{|Samples' $OUT/p.txt; python3 $R/spy_probe.py --summary $OUT/$1.json
  else
    tail -5 $OUT/p.txt; echo "py-spy failed; the probe alone:"; python3 $R/spy_probe.py $2 $3 2>&1 | grep '^{'
  fi
}
spy m1 minilm-l6 default; spy m1b minilm-l6 blocking; spy m2b minilm-l6 blocking; spy m2 minilm-l6 default
spy b1 bert-base default
rm -f $OUT/p.txt; gzip $OUT/*.json
