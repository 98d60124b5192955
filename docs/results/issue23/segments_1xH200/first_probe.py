"""Where the main thread's time goes in a first pass vs a warm pass (cProfile of the main thread, sync warnings)."""
import cProfile, io, pstats, sys, tempfile, time, warnings
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from gpu_checks import random_model, sts_pool, synthetic
from bertflow import SentenceEncoder
G = Path(".speed/gpu")
arch = sys.argv[1]
pool = sts_pool(G / "sts"); rng = np.random.default_rng(0)
text = [pool[i] for i in rng.permutation(np.arange(40000) % len(pool))]
with tempfile.TemporaryDirectory() as tmp:
    model = random_model(arch, G / "tok", Path(tmp) / arch)
    enc = SentenceEncoder(str(model), pooling="mean", device="cuda")
    enc.encode(synthetic(G / "tok", 20000), show_progress_bar=False)
    for label in ("first", "warm", "warm2"):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(1)
        prof = cProfile.Profile()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = time.perf_counter(); prof.enable()
            enc.encode(text, show_progress_bar=False)
            prof.disable(); torch.cuda.synchronize(); wall = time.perf_counter() - t
        torch.cuda.set_sync_debug_mode(0)
        syncs = [str(w.message)[:120] for w in caught if "ynchroniz" in str(w.message)]
        print(f"== {arch} {label}: {wall:.4f} s ({len(text)/wall:.0f}/s), sync warnings {len(syncs)}", syncs[:3])
        buf = io.StringIO(); pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
        print("\n".join(l for l in buf.getvalue().splitlines()[6:32] if l.strip()))
    enc.close()
