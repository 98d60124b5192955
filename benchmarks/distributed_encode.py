"""Encoding throughput of ``bertflow distributed-encode`` on 1 and N devices, and the scaling efficiency.

Protocol (also written into the JSON result):

- Model: a random-weight BERT built from a ``BertConfig`` (default BERT-base: 12 layers, hidden 768, 12 heads,
  intermediate 3072; weights seeded, so every run encodes with the same model), saved to a local folder with a
  fast WordPiece tokenizer from ``--vocab`` (a BERT ``vocab.txt``; ``synthetic`` makes one up). Mean pooling,
  max_length 64, dtype ``auto`` (bfloat16 on CUDA, float32 on CPU). Random weights cost the same FLOPs as trained
  ones, so throughput is representative; nothing is downloaded.
- Input: ``--sentences`` synthetic sentences of whole vocabulary words (about 19 tokens on average with the
  special tokens, the length of an STS sentence) or the lines of ``--text``; one text file on local disk.
- For every process count in ``--nprocs`` (default ``1,2``): one ``torchrun --standalone --nproc_per_node=N -m
  bertflow distributed-encode`` job writing a fresh store (``--overwrite``), rank ``i`` on ``cuda:i``.
- Throughput, from the job's own summary: ``rows_per_second`` = rows / seconds between the barrier after every
  rank loaded the model and the barrier after the last shard (tokenising, encoding and writing shards included;
  process start and model load excluded, reported separately as ``job_seconds``); ``steady_rows_per_second``
  leaves out each rank's first shard (CUDA warm-up), summing the ranks' rates.
- Scaling efficiency for N = throughput(N) / (N x throughput(1)). The stores of N > 1 are also compared with the
  1-process store: with the same chunk and batch sizes every forward pass holds the same sentences, so on the
  same kind of GPU they should be bit-identical (``identical_to_1``).

Usage (from the repository root; bertflow imported from ``src`` when not installed)::

    python benchmarks/distributed_encode.py --vocab PATH/vocab.txt --out OUTDIR              # 2 GPUs
    python benchmarks/distributed_encode.py --vocab synthetic --out /tmp/b --device cpu --tiny --sentences 3000

Prints the result as JSON and writes it to ``OUTDIR/distributed_encode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:  # run from a checkout without installing: the device machines have torch and transformers, not bertflow
    import bertflow  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from bertflow import __version__  # noqa: E402
from bertflow.resources import usable_cpus  # noqa: E402
from bertflow.scale.layout import DEFAULT_SHARD_SIZE  # noqa: E402
from bertflow.scale.reader import open_embeddings  # noqa: E402

BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


def synthetic_vocab(path: Path, size: int = 30522) -> Path:
    """Write a BERT-style vocab.txt of ``size`` entries: specials, single characters and made-up words."""
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = letters + list("0123456789.,;:!?'\"()-")
    words: set[str] = set()
    while len(words) < size - len(specials) - 2 * len(chars):
        words.add("".join(rng.choice(letters, size=int(rng.integers(2, 10)))))
    vocab = specials + chars + [f"##{c}" for c in chars] + sorted(words)
    path.write_text("\n".join(vocab[:size]) + "\n", encoding="utf-8")
    return path


def build_model(folder: Path, vocab: Path, shape: dict[str, int], max_length: int) -> Path:
    """Save a seeded random-weight BertModel and its fast tokenizer into ``folder``."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=max(512, max_length), **shape)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_sentences(path: Path, vocab: Path, n: int) -> None:
    """``n`` sentences of whole vocabulary words, 3 to 60 words, about 17 on average (~19 tokens with specials)."""
    words = [
        w for w in vocab.read_text(encoding="utf-8").split() if w.isalpha() and not w.startswith("[") and len(w) > 1
    ]
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.normal(17, 6, size=n).round().astype(int), 3, 60)
    picks = rng.integers(0, len(words), size=int(lengths.sum()))
    with open(path, "w", encoding="utf-8") as fh:
        pos = 0
        for k in lengths:
            fh.write(" ".join(words[i] for i in picks[pos : pos + k]) + ".\n")
            pos += k


def mean_tokens(model_dir: Path, text: Path, sample: int = 2000) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with open(text, encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for _, line in zip(range(sample), fh, strict=False)]
    ids = tokenizer(lines, truncation=True, max_length=64)["input_ids"]
    return float(np.mean([len(x) for x in ids]))


def run_job(
    nprocs: int, args: argparse.Namespace, model_dir: Path, text: Path, store: Path, threads: int
) -> dict[str, Any]:
    """One torchrun job; returns its summary plus the job's wall time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "true")
    # The same torch CPU threads per rank in every job (torchrun alone would give 1 to N > 1 ranks and all cores
    # to a single one): ranks are then equal units of work, and CPU results comparable bit for bit.
    env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nprocs}",
        "-m",
        "bertflow",
        "distributed-encode",
        str(text),
        "-o",
        str(store),
        "--model",
        str(model_dir),
        "--pooling",
        "mean",
        "--max-length",
        str(args.max_length),
        "--shard-size",
        str(args.shard_size),
        "--chunk-size",
        str(args.chunk_size),
        "--dtype",
        args.dtype,
        "--overwrite",
        "-q",
    ]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    if args.device == "cpu":
        cmd += ["--device", "cpu"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    job_seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"the {nprocs}-process job failed with exit code {proc.returncode}")
    summary = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    steady = 0.0
    for rank in summary["per_rank"]:
        times, rows = rank["shard_seconds"][1:], rank["shard_rows"][1:]
        if times:
            steady += sum(rows) / sum(times)
    summary["steady_rows_per_second"] = round(steady, 2) if steady else None
    summary["job_seconds"] = round(job_seconds, 2)
    return summary


def same_arrays(a: Path, b: Path) -> tuple[bool, float]:
    """Whether two stores hold bit-identical rows, and the largest absolute difference."""
    x, y = open_embeddings(a), open_embeddings(b)
    if x.shape != y.shape:
        return False, float("inf")
    identical, worst = True, 0.0
    for start in range(0, x.shape[0], 65536):
        u, v = x.rows(start, start + 65536), y.rows(start, start + 65536)
        identical &= bool(np.array_equal(u, v))
        worst = max(worst, float(np.abs(u.astype(np.float64) - v).max()))
    return identical, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", required=True, help="A BERT vocab.txt, or 'synthetic' to make one up.")
    parser.add_argument("--out", required=True, type=Path, help="Folder for the JSON result.")
    parser.add_argument("--work", type=Path, default=None, help="Scratch folder (model, input, stores); default tmp.")
    parser.add_argument("--nprocs", default="1,2", help="Comma-separated process counts to run (default 1,2).")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sentences", type=int, default=500_000, help="Synthetic sentences to encode.")
    parser.add_argument("--text", type=Path, default=None, help="Encode the lines of this file instead.")
    parser.add_argument("--tiny", action="store_true", help="A 2-layer, 64-wide BERT (CPU smoke test).")
    parser.add_argument("--batch-size", type=int, default=None, help="Cap per forward pass (default: token budget).")
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--shard-size", type=int, default=None, help="default: distributed-encode's own")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    if args.shard_size is None:
        args.shard_size = DEFAULT_SHARD_SIZE
    counts = sorted({int(c) for c in args.nprocs.split(",")})
    if args.device == "cuda" and max(counts) > torch.cuda.device_count():
        raise SystemExit(f"--nprocs asks for {max(counts)} GPUs but {torch.cuda.device_count()} are visible")

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="bertflow-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    vocab = synthetic_vocab(work / "vocab.txt") if args.vocab == "synthetic" else Path(args.vocab)
    shape = TINY if args.tiny else BERT_BASE
    model_dir = build_model(work / "model", vocab, shape, args.max_length)
    if args.text is not None:
        text = args.text
    else:
        text = work / "sentences.txt"
        write_sentences(text, vocab, args.sentences)
    n_rows = sum(1 for _ in open(text, "rb"))

    threads = max(1, usable_cpus() // max(counts))
    runs: dict[str, Any] = {}
    for n in counts:
        print(f"running {n} process(es)...", file=sys.stderr, flush=True)
        runs[str(n)] = run_job(n, args, model_dir, text, work / f"store-{n}", threads)
    base = runs.get("1")
    scaling: dict[str, Any] = {}
    if base:
        for n in counts:
            if n == 1:
                continue
            run = runs[str(n)]
            identical, worst = same_arrays(work / "store-1", work / f"store-{n}")
            entry = {
                "speedup": round(run["rows_per_second"] / base["rows_per_second"], 4),
                "efficiency": round(run["rows_per_second"] / (n * base["rows_per_second"]), 4),
                "identical_to_1": identical,
                "max_abs_diff_to_1": worst,
            }
            if run["steady_rows_per_second"] and base["steady_rows_per_second"]:
                entry["steady_efficiency"] = round(
                    run["steady_rows_per_second"] / (n * base["steady_rows_per_second"]), 4
                )
            scaling[str(n)] = entry
    result = {
        "benchmark": "distributed_encode",
        "card": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "devices_visible": torch.cuda.device_count() if args.device == "cuda" else usable_cpus(),
        "device": args.device,
        "model": {"type": "random-weight BERT", **shape, "pooling": "mean", "max_length": args.max_length},
        "dtype": args.dtype,
        "sentences": n_rows,
        "mean_tokens": round(mean_tokens(model_dir, text), 2),
        "batch_size": args.batch_size,
        "chunk_size": args.chunk_size,
        "shard_size": args.shard_size,
        "torch_threads_per_rank": threads,
        "runs": {
            n: {
                k: r[k]
                for k in (
                    "world_size",
                    "rows_per_second",
                    "steady_rows_per_second",
                    "seconds",
                    "job_seconds",
                    "per_rank",
                )
            }
            for n, r in runs.items()
        },
        "scaling": scaling,
        "versions": {"bertflow": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }
    (args.out / "distributed_encode.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
