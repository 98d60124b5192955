# Session 16, call h: is the host's slow state a CPU quota of the container (cgroup throttling)? The cgroup's CPU
# limit and throttling counters before and after two MiniLM-L6 processes with the ruler; the CPUs' clock as the
# kernel reports it.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name --format=csv,noheader
for f in /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpuset.cpus.effective /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us /sys/fs/cgroup/cpu/cpu.stat; do [ -e $f ] && { echo "== $f"; cat $f; }; done
grep -m3 MHz /proc/cpuinfo; grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(hypervisor|ht|constant_tsc)$' | tr '\n' ' '; echo
ls /sys/devices/system/cpu/cpu0/cpufreq 2>/dev/null | head -3
for i in 1 2; do
  PYTHONPATH=$S:$B timeout 120 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs minilm-l6 --rounds 3 --ruler --json $OUT/m$i.json > /dev/null 2>&1
  python3 -c "import json; d=json.load(open('$OUT/m$i.json')); r=d['runs']['minilm-l6']; print('m$i', r['rounds'], r['ruler_ms'], d['ruler_ms_whole_run'])"
done
for f in /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpu/cpu.stat; do [ -e $f ] && { echo "== $f after"; cat $f; }; done
grep -m3 MHz /proc/cpuinfo
rm -f $OUT/*.json
