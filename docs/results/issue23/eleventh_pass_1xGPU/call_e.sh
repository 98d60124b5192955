# Session 16, call e: one chunk's launch, host and device time, for main and three cheaper ways of queueing a layer
# (launch_probe.py), MiniLM-L6 and BERT-base. Worth a full measurement only if a variant cuts MiniLM-L6's host time by
# at least 15% with outputs within bf16 rounding and BERT-base's device time no more than 1% higher.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; R=$PWD/docs/results/issue23/eleventh_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
cd $G
for a in minilm-l6 bert-base minilm-l6; do
  timeout 200 python3 $R/launch_probe.py $a 30 > $OUT/o.txt 2>&1; grep '^{' $OUT/o.txt || tail -6 $OUT/o.txt
done
rm -f $OUT/o.txt
