# Session 20, call g: call f measured Embedder.encode with the whitening 12% slower than SentenceEncoder.encode (graphed
# transform; flow -4.4%), where earlier passes measured about -1%. Is it the pre-fault? calibrator_overhead_gpu.py
# twice with the library as it is and twice with the pre-fault off everywhere (no_prefault_run.py), alternating.
# Rule, fixed before the call: if the graphed whitening's or flow's overhead with the pre-fault exceeds the one without
# it by more than 3 points in both repetitions, the transform case is dropped (call d's library: no pre-fault with a
# transform); otherwise it stays, and the calibration bar (issue 23's table, <= 2%) is reported from all four runs.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/fifteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
ov() { # tag runner...
  PYTHONPATH=$S:$B timeout 70 python3 "${@:2}" $B/calibrator_overhead_gpu.py --tokenizer-dir $G/tok --data-dir $G/sts --json $OUT/$1.json 2>$OUT/err_$1.txt | grep -E "^(flow|whitening) " | sed "s/^/$1 /" || tail -3 $OUT/err_$1.txt
}
ov on1; ov off1 $R/no_prefault_run.py; ov off2 $R/no_prefault_run.py; ov on2
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
