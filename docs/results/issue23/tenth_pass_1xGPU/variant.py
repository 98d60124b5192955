"""Run a script with host-side variants patched in (session 15 probe, issue 23 goal 2):
python variant.py NAME[,NAME...] script.py args...
  def      nothing changed
  nocheck  cut_chunks does not check sentences (upper bound of moving the check off the parent's GIL)
  nopin    chunk batches packed into pageable buffers (no pinned host memory for inputs)
  siX      FAST_SWITCH_INTERVAL = X ms
  pinw     each tokeniser worker process runs on the upper half of the usable cores (the parent is left alone)
"""
import runpy, sys
import bertflow.encoding.batching as batching
import bertflow.encoding.encoder as encoder
for name in sys.argv[1].split(","):
    if name == "def":
        pass
    elif name == "nocheck":
        batching.check_sentences = lambda items, **kw: None
    elif name == "nopin":
        orig = encoder.prepare_chunk
        encoder.prepare_chunk = lambda *a, **kw: orig(*a, **{**kw, "pinned": False})
    elif name == "pinw":
        import os
        import bertflow.encoding.tokenizer_pool as tp
        init = tp._init_worker
        def pinned_init(tokenizer_json, init=init):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, cores[len(cores) // 2:])
            init(tokenizer_json)
        tp._init_worker = pinned_init
    elif name.startswith("si"):
        batching.FAST_SWITCH_INTERVAL = float(name[2:]) * 1e-3
    else:
        raise SystemExit(f"unknown variant {name}")
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
