# NOT RUN YET (session 20's device time was spent): the next call, rules fixed now, before it runs.
# Call g's rule dropped the pre-fault with a transform: it compared Embedder.encode's overhead over
# SentenceEncoder.encode with the pre-fault on and off, and the pre-fault moves that ratio's denominator too (with it
# on, SentenceEncoder.encode took 0.249-0.257 s, off 0.259-0.271 s). So since then the library pre-faults without a
# transform only, and the calibration bar (issue 23's table: Embedder.encode within 2% of SentenceEncoder.encode) has not been measured with the
# library as it stands. transform_prefault_probe.py times, in one process, SentenceEncoder.encode, Embedder.encode
# (the library) and Embedder.encode with a result pre-faulted at the encoder's width (prefault_variant.py's shim).
# Rules:
#   A. The library pre-faults with a transform too (at the encoder's width, a new array when the first chunk is
#      narrower: the encoder of commit 8add975) if "Embedder.encode prefaulted" has a lower median than
#      "Embedder.encode" for both calibrators in at least 2 of the 3 processes.
#   B. The calibration bar from the same runs: met if the library's overhead (after rule A: the side the library then is) has a
#      median over the three processes of at most 2% for the flow and for the whitening.
# One call, about 3 minutes: `bash docs/results/issue23/fifteenth_pass_1xGPU/next_call.sh`.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/fifteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for i in 1 2 3; do
  PYTHONPATH=$S:$B timeout 150 python3 $R/transform_prefault_probe.py --tokenizer-dir $G/tok --data-dir $G/sts --json $OUT/p$i.json 2>$OUT/err_p$i.txt | sed "s/^/p$i /" || tail -3 $OUT/err_p$i.txt
done
cd $OUT && tar czf results.tgz *.json err_*.txt 2>/dev/null; rm -f *.json err_*.txt; ls
