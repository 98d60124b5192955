# Session 16, call c: MiniLM-L6 first passes after a sweep of the layer's matrix products over the token counts the
# packed layout can give (sweep_probe.py full / geo) against none, four rotations, one process each. Rule fixed
# before the call: if `full` gives first passes within 10% of the same process's warm median in at least 3 of 4
# processes while `none` does not, the one-time cost of new GEMM shapes is the first-pass gap, and a warm-up of
# them is worth building (then `geo` says whether a cheap one is enough).
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; R=$PWD/docs/results/issue23/eleventh_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
cd $G
sp() { timeout 120 python3 $R/sweep_probe.py $1 $2 > $OUT/o.txt 2>&1; grep "^{" $OUT/o.txt || { echo "$1 $2 failed"; tail -4 $OUT/o.txt; }; }
for i in 1 2 3 4; do
  case $i in 1) order="none full geo";; 2) order="full geo none";; 3) order="geo none full";; 4) order="none geo full";; esac
  for m in $order; do sp minilm-l6 $m; done
done
for m in none full none full; do sp bert-base $m; done
rm -f $OUT/o.txt
