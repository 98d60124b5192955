# Sixteenth pass, call d (rules fixed before it runs). Since call c: Embedder.encode tells the encoder its calibrator's
# output width (SentenceEncoder.encode(transform_dim=), 6c72790). The random BERT-base's whitening keeps 767 of 768
# directions (a LayerNorm without learned scale leaves every vector summing to zero), so until now each calibrated
# encode pre-faulted a 768-wide result, dropped it at the first chunk and made and wrote a 767-wide one: likely why
# the whitening cost more than the flow (call a: +2.66% against +0.33%) although its kernels cost almost nothing.
#   F. the four test files on the GPU: a failing test in test_stream.py or test_embedder.py reverts 6c72790.
#   B. the calibration bar, transform_probe.py x3: met if the median over the three processes of Embedder.encode's
#      overhead over SentenceEncoder.encode is at most 2% for the flow and for the whitening.
#   G. goal 3 at this commit: gpu_checks.py scaleout --rows 500000 --rounds 2 (no baseline): met if the ratio is 0.9
#      or more. (Its Embedder.encode side uses a whitening of 767 directions, so it gains from 6c72790 too.)
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/sixteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
PYTHONPATH=$S:$B:$PWD timeout 200 python3 $B/gpu_checks.py tests --test-files tests/encoding/test_stream.py,tests/encoding/test_prefault.py,tests/calibrators/test_device.py,tests/test_embedder.py --commit $(cat $G/commit) --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('tests', d['counts'], d['exit_status'], d['not_passed'])" $OUT/tests.json || true
for i in 1 2 3; do
  PYTHONPATH=$S:$B timeout 120 python3 $R/transform_probe.py --tokenizer-dir $G/tok --data-dir $G/sts --json $OUT/p$i.json 2>$OUT/err_p$i.txt | grep -v "^ " | sed "s/^/p$i /" || tail -3 $OUT/err_p$i.txt
done
PYTHONPATH=$S:$B timeout 200 python3 $B/gpu_checks.py scaleout --tokenizer-dir $G/tok --data-dir $G/sts --rows 500000 --rounds 2 --json $OUT/scaleout.json > /dev/null 2>$OUT/err_scaleout.txt || tail -5 $OUT/err_scaleout.txt
python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
print({k: v for k, v in d.items() if k not in ('jobs', 'embedder_encode_seconds', 'command')})
print([(j['code'], j['summary']['rows_per_second'], j['summary']['per_rank'][0]['shard_seconds']) for j in d.get('jobs', [])])" $OUT/scaleout.json || true
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt; ls
