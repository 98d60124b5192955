"""Paragraphs of 8-25 STS sentences (up to 512 tokens) through random BERT-base, bf16, max_length 512: rate of the
default path (two passes after a warm-up) and its max 1 - cos against the padded forward (unpadded=False)."""
import sys, tempfile, time
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, "benchmarks")
from gpu_checks import random_model, sts_pool
from bertflow import SentenceEncoder
from bertflow.encoding.settings import EncodeSettings
G = Path(".speed/gpu")
pool = sts_pool(G / "sts"); rng = np.random.default_rng(0)
paras = [" ".join(pool[i] for i in rng.integers(0, len(pool), rng.integers(8, 26))) for _ in range(6000)]
with tempfile.TemporaryDirectory() as tmp:
    model = random_model("bert-base", G / "tok", Path(tmp) / "m")
    enc = SentenceEncoder(str(model), pooling="mean", device="cuda", max_length=512)
    enc.encode(paras[:2000], show_progress_bar=False)
    rates = []
    for _ in range(2):
        torch.cuda.synchronize(); t = time.perf_counter()
        got = enc.encode(paras[2000:], show_progress_bar=False)
        torch.cuda.synchronize(); rates.append(4000 / (time.perf_counter() - t))
    ref = SentenceEncoder(str(model), pooling="mean", device="cuda", max_length=512, settings=EncodeSettings(unpadded=False)).encode(paras[2000:4000], show_progress_bar=False)
    a, b = torch.from_numpy(got[:2000]), torch.from_numpy(ref)
    dev = float((1 - torch.nn.functional.cosine_similarity(a, b, dim=1)).max())
    print("long paragraphs, rate per pass", [round(r) for r in rates], "max 1-cos vs padded %.2e" % dev, "attention", getattr(enc._runner.cuda_attention, "__name__", "?"))
