"""A peer embedding engine beside bertflow on the same card (issue 23 goal 4): infinity-emb's Python batch API.

Random-weight BERT-base (bf16, mean pooling, max_length as the model folder gives: 512 for infinity, 64 for bertflow;
STS sentences are far shorter, so truncation does not differ) on ``--sentences`` STS sentences: bertflow's
``SentenceEncoder.encode`` and infinity-emb's ``AsyncEmbeddingEngine.embed`` (torch engine, no BetterTransformer,
one call with every sentence, so its own batch handler sorts and batches them), per ``--batch-sizes``. First pass
(the process has not met the text) and the median of ``--rounds`` warm passes; the largest 1 - cos between the two
engines' vectors. infinity-emb is not a dependency: carry its wheel (``pip download --no-deps infinity-emb``) and
put it on ``PYTHONPATH``; if it cannot be imported or run, the JSON says why.

    PYTHONPATH=src:benchmarks python3 benchmarks/peer_gpu.py --tokenizer-dir TOK --data-dir STS --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_checks import cosine_gap, random_model, sts_pool, synthetic  # noqa: E402


def timed(fn: Any, rounds: int) -> tuple[list[float], Any]:
    """Seconds of each of ``1 + rounds`` calls of ``fn`` (synchronised), and the last result."""
    times, result = [], None
    for _ in range(1 + rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times, result


def summary(n: int, times: list[float]) -> dict[str, Any]:
    return {
        "first_pass_sentences_per_s": round(n / times[0]),
        "warm_sentences_per_s": round(n / statistics.median(times[1:])),
        "rounds": [round(n / t) for t in times],
    }


def infinity(model: Path, text: list[str], warm: list[str], batch_size: int, rounds: int) -> tuple[dict, Any]:
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    args = EngineArgs(
        model_name_or_path=str(model),
        engine="torch",
        device="cuda",
        dtype="bfloat16",
        batch_size=batch_size,
        bettertransformer=False,
        model_warmup=False,
        pooling_method="mean",
    )

    async def run() -> tuple[dict, Any]:
        engine = AsyncEmbeddingEngine.from_args(args)
        async with engine:
            await engine.embed(sentences=warm)
            times, vectors = [], None
            for _ in range(1 + rounds):
                torch.cuda.synchronize()
                t = time.perf_counter()
                vectors, _usage = await engine.embed(sentences=text)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
        return summary(len(text), times), np.asarray(vectors, dtype=np.float32)

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-sizes", default="256,1024")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from bertflow import SentenceEncoder

    pool = sts_pool(args.data_dir)
    rng = np.random.default_rng(0)
    text = [pool[i] for i in rng.permutation(np.arange(args.sentences) % len(pool))]
    warm = synthetic(args.tokenizer_dir, 8000)
    out: dict[str, Any] = {
        "card": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    with tempfile.TemporaryDirectory(prefix="bertflow-peer-") as tmp:
        model = random_model("bert-base", args.tokenizer_dir, Path(tmp) / "bert-base")
        enc = SentenceEncoder(str(model), pooling="mean", device="cuda")
        enc.encode(warm, show_progress_bar=False)
        times, ours = timed(lambda: enc.encode(text, show_progress_bar=False), args.rounds)
        out["bertflow"] = summary(len(text), times)
        enc.close()  # its workers stop; the model's memory goes with the process
        torch.cuda.empty_cache()
        try:
            import infinity_emb

            out["infinity_version"] = infinity_emb.__version__
        except Exception:  # noqa: BLE001 - recorded: why the peer cannot run here
            out["infinity_error"] = traceback.format_exc()[-3000:]
        if "infinity_error" not in out:
            for bs in (int(b) for b in args.batch_sizes.split(",")):
                try:
                    res, theirs = infinity(model, text, warm, bs, args.rounds)
                    res["max_1_minus_cos_vs_bertflow"] = cosine_gap(theirs, ours)
                    res["bertflow_over_infinity_warm"] = round(
                        out["bertflow"]["warm_sentences_per_s"] / res["warm_sentences_per_s"], 2
                    )
                    out[f"infinity_bs{bs}"] = res
                except Exception:  # noqa: BLE001
                    out[f"infinity_bs{bs}_error"] = traceback.format_exc()[-3000:]
                print(json.dumps({k: v for k, v in out.items() if k.startswith("infinity")}, default=str), flush=True)
                torch.cuda.empty_cache()
    text_out = json.dumps(out, indent=2, default=str)
    print(text_out)
    if args.json:
        args.json.write_text(text_out + "\n")


if __name__ == "__main__":
    main()
