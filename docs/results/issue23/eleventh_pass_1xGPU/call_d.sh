# Session 16, call d: a ruler process (monitor_probe.py ruler: a fixed ~0.4 ms of Python, repeated) runs beside
# eight MiniLM-L6 processes and two BERT-base processes of main (one at a time, four passes each); each pass's rate
# is printed beside the ruler's median during it. If the slow passes are those where the ruler is slow too, the host's
# cores were slower then (not our code); if the ruler is steady through slow passes, the cause is inside the process.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; R=$PWD/docs/results/issue23/eleventh_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
cd $G
python3 $R/monitor_probe.py ruler $OUT/ruler.json 300 &
for i in 1 2 3 4 5 6 7 8; do timeout 100 python3 $R/monitor_probe.py passes minilm-l6 2>/dev/null | grep '^{' >> $OUT/passes.jsonl; done
for i in 1 2; do timeout 100 python3 $R/monitor_probe.py passes bert-base 2>/dev/null | grep '^{' >> $OUT/passes.jsonl; done
wait
python3 $R/monitor_probe.py report $OUT/ruler.json $OUT/passes.jsonl
gzip $OUT/ruler.json
