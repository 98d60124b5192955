# Session 20, call e: goals 1 and 2 with the defaults at ab230fa (the pre-fault in), no pair: five fresh processes on
# whatever host the call gets (call d's host ran faster than calls a-c's: MiniLM-L6 warm 585-597k against 401-461k),
# three BERT-base and two MiniLM-L6, each a first pass on text never seen and five warm rounds, ruler and counters on.
# Nothing is adopted from this call; it adds first passes to goal rows 1 and 2.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/fifteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag arch
  PYTHONPATH=$S:$B timeout 100 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --rounds 5 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 $R/summarise.py $OUT/$1.json || true
}
tp b1 bert-base; tp m1 minilm-l6; tp b2 bert-base; tp m2 minilm-l6; tp b3 bert-base
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
