# Session 22, call a: (1) the CUDA tests at the compaction commit (calibrators/flow_trainer.py's CUDA-graph training
# step became the function _capture_step; encoding/encoder.py's empty input uses transform_dim), and (2) the CUDA
# chunk ramp's ceiling: SentenceEncoder.encode with the default chunk_size (ramp 4,096 -> 65,536) against
# chunk_size=16,384, two encoders in one process, passes alternating (gpu_checks.py throughput --pair), on 200,000
# STS sentences (40,000 would not tell them apart: the ramp reaches 16,384 at its third chunk and the rest is less).
# Why: the sixteenth pass saw Embedder.encode at 16,384 run 175.6k against 164k for the default, in sequence.
# Rule fixed before the call: the CUDA default chunk becomes 16,384 only if, for both architectures and in both
# pair orders, the 16,384 side's warm median is at least 1.02x the default side's and its first pass is at least
# 0.98x; otherwise the default stays.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; C=$(cat $G/commit)
echo commit $C; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
PYTHONPATH=$S:$B timeout 240 python3 $B/gpu_checks.py tests --commit $C --json $OUT/cuda_tests.json 2>&1 | grep -E "passed|failed" | tail -1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['card'], d['counts'], d['not_passed'])" $OUT/cuda_tests.json
for arch in bert-base minilm-l6; do
  for order in ab ba; do
    t=${arch}_$order
    PYTHONPATH=$S:$B timeout 170 python3 $B/gpu_checks.py throughput --pair chunk_size=16384 --pair-order $order --sentences 200000 --rounds 4 --tokenizer-dir $G/tok --data-dir $G/sts --archs $arch --json $OUT/tp_$t.json > /dev/null 2>$OUT/err_$t.txt || tail -5 $OUT/err_$t.txt
    python3 - $OUT/tp_$t.json $t <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
runs = list(d["runs"].values())
a, b = runs[0], runs[1]
print(sys.argv[2], d["card"], "default", a["first_pass_sentences_per_s"], a["warm_sentences_per_s"], a["rounds"],
      "| 16384", b["first_pass_sentences_per_s"], b["warm_sentences_per_s"], b["rounds"],
      "| ratios first %.3f warm %.3f" % (b["first_pass_sentences_per_s"] / a["first_pass_sentences_per_s"],
                                        b["warm_sentences_per_s"] / a["warm_sentences_per_s"]))
PY
  done
done
