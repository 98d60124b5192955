# RAN as call h (session 21, 0d3d297, H100 80GB HBM3): rules fixed before it ran, applied in summarise.py.
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
#   C. After the calls, the pre-fault became encoding/prefault.py's PageWriter: the result's rows written block by block
#      on a thread, at most 512 MB beyond the rows the chunks have asked for (call d's whole-array fill before the first
#      chunk would hold up a large encode until all of it was written, and take all its memory at once). Its first GPU
#      run: tests/encoding/test_prefault.py, test_stream.py and calibrators/test_device.py; then `--pair prefault=false`
#      for MiniLM-L6 and BERT-base on 40,000 sentences and BERT-base on 400,000 (a 1.2 GB result, past the bound). It
#      stays if every test passes and its main thread's median system time a pass is lower in 3 of 3 processes; if
#      its warm median is more than 3% below prefault=false's in 2 of 3, the default becomes off until that is
#      understood. A failing test reverts it to call d's whole-array fill.
# One call, about 7 minutes: `bash docs/results/issue23/fifteenth_pass_1xGPU/next_call.sh`.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/fifteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
PYTHONPATH=$S:$B:$PWD timeout 150 python3 $B/gpu_checks.py tests --test-files tests/encoding/test_prefault.py,tests/encoding/test_stream.py,tests/calibrators/test_device.py --commit $(cat $G/commit) --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('tests', d['counts'], d['exit_status'], d['not_passed'])" $OUT/tests.json || true
for i in 1 2 3; do
  PYTHONPATH=$S:$B timeout 150 python3 $R/transform_prefault_probe.py --tokenizer-dir $G/tok --data-dir $G/sts --json $OUT/p$i.json 2>$OUT/err_p$i.txt | sed "s/^/p$i /" || tail -3 $OUT/err_p$i.txt
done
tp() { # tag arch order sentences rounds
  PYTHONPATH=$S:$B timeout 150 python3 $B/gpu_checks.py throughput --pair prefault=false --pair-order $3 --sentences $4 --rounds $5 --tokenizer-dir $G/tok --data-dir $G/sts --archs $2 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 $R/summarise.py $OUT/$1.json || true
}
tp m1 minilm-l6 ab 40000 5; tp b1 bert-base ba 40000 5; tp b2 bert-base ab 400000 3
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt; ls
