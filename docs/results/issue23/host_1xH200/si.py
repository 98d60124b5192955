"""Run a script with another GIL switch interval: python si.py SECONDS script.py args..."""
import runpy, sys
sys.setswitchinterval(float(sys.argv[1]))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
