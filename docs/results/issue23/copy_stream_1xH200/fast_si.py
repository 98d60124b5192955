"""Run a script with another FAST_SWITCH_INTERVAL (the switch interval a CUDA stream's prefetcher holds):
python fast_si.py SECONDS script.py args..."""
import runpy, sys
import bertflow.encoding.batching as batching
batching.FAST_SWITCH_INTERVAL = float(sys.argv[1])
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
