# Session 22, call b: one step lower. Call a's rule adopted chunk_size=16,384 as the CUDA default (1.06-1.41x the
# default 65,536 in first passes, 1.07-1.37x warm, both architectures, both orders). Here chunk_size=8,192 against
# 16,384, same protocol (two encoders in one process, passes alternating, 200,000 STS sentences, 4 warm rounds).
# Rule fixed before the call: the default becomes 8,192 only if, for both architectures and in both pair orders,
# the 8,192 side's warm median is at least 1.02x the 16,384 side's and its first pass at least 0.98x; otherwise
# 16,384 stays. (32,768 is not measured: it lies between 16,384 and the 65,536 that lost by 7-37%.)
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; C=$(cat $G/commit)
echo commit $C; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
for arch in bert-base minilm-l6; do
  for order in ab ba; do
    t=${arch}_$order
    PYTHONPATH=$S:$B timeout 140 python3 $B/gpu_checks.py throughput --settings chunk_size=16384 --pair chunk_size=8192 --pair-order $order --sentences 200000 --rounds 4 --tokenizer-dir $G/tok --data-dir $G/sts --archs $arch --json $OUT/tp_$t.json > /dev/null 2>$OUT/err_$t.txt || tail -5 $OUT/err_$t.txt
    python3 - $OUT/tp_$t.json $t <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
runs = list(d["runs"].values())
a, b = runs[0], runs[1]
print(sys.argv[2], d["card"], "16384", a["first_pass_sentences_per_s"], a["warm_sentences_per_s"], a["rounds"],
      "| 8192", b["first_pass_sentences_per_s"], b["warm_sentences_per_s"], b["rounds"],
      "| ratios first %.3f warm %.3f" % (b["first_pass_sentences_per_s"] / a["first_pass_sentences_per_s"],
                                        b["warm_sentences_per_s"] / a["warm_sentences_per_s"]))
PY
  done
done
