G=$PWD/.speed/gpu
PYTHONPATH=$PWD/src timeout 120 python3 $G/probe.py p1
PYTHONPATH=$PWD/src timeout 60 python3 $G/probe.py p2
ls -la ~/.triton/cache 2>&1 | head -3; du -sh ~/.triton 2>&1; df -h ~ | tail -1
