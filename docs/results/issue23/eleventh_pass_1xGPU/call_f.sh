# Session 16, call f: where one chunk's device time goes, by kernel (kernel_probe.py), BERT-base and MiniLM-L6.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; R=$PWD/docs/results/issue23/eleventh_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
cd $G
for a in bert-base minilm-l6; do
  timeout 200 python3 $R/kernel_probe.py $a > $OUT/o.txt 2>&1; grep -v '^{' $OUT/o.txt | grep -E '^ |ms of kernels' || tail -6 $OUT/o.txt
done
rm -f $OUT/o.txt
