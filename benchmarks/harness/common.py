"""Shared parts of the benchmarks: text sets, random-weight models, FLOP and padding counts, interleaved timing,
the environment record and the results file.

Units: seconds, sentences/s, tokens/s; "real" tokens are the sentences' own tokens after truncation (special
tokens included), "padded" tokens are what the model computed on (rows x width summed over batches).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "H100_BF16_PEAK",
    "MODEL_CONFIGS",
    "build_random_model",
    "environment",
    "interleave",
    "long_texts",
    "model_flops",
    "replicate",
    "save_json",
    "st_padded_tokens",
    "sts_sentences",
    "sync",
    "synthetic_sentences",
]

#: H100 SXM dense bf16 peak (datasheet), FLOP/s. The lent H100 reached 798 TFLOP/s on an 8192^3 GEMM.
H100_BF16_PEAK = 989e12

#: Architectures of the random-weight models built for GPU runs (no network there): BertConfig overrides.
MODEL_CONFIGS: dict[str, dict[str, int]] = {
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    # all-MiniLM-L6-v2's architecture
    "minilm-l6": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    # a toy for smoke tests of the benchmark code itself
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
}


# -- data ---------------------------------------------------------------------------------------------------


def sts_sentences(data_dir: str | Path | None = None) -> list[str]:
    """Distinct sentences of every STS task (STS12-16, STS-B, SICK-R; about 29.5k), in first-seen order, read from
    ``data_dir`` (``None``: where the CLI looks, :func:`bertflow.cli.evaluate.find_data_dir`)."""
    from bertflow.cli.evaluate import find_data_dir
    from bertflow.evaluation.datasets import load_sts_tasks

    tasks = load_sts_tasks(data_dir=find_data_dir(None if data_dir is None else Path(data_dir)))
    return list(dict.fromkeys(s for task in tasks.values() for s in task.fit_sentences("target")))


def synthetic_sentences(n: int, seed: int = 0, min_words: int = 4, max_words: int = 30) -> list[str]:
    """STS-like text when no data is at hand: Zipf-distributed pseudo-words, 4-30 per sentence."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "an", "el", "or"]
    vocab = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(20000)]
    ranks = np.minimum(rng.zipf(1.3, size=n * max_words), len(vocab)) - 1
    lengths = rng.integers(min_words, max_words + 1, size=n)
    out, pos = [], 0
    for k in lengths:
        out.append(" ".join(vocab[r] for r in ranks[pos : pos + k]).capitalize() + ".")
        pos += k
    return out


def replicate(sentences: Sequence[str], n: int, seed: int = 0) -> list[str]:
    """``n`` sentences drawn by cycling through a seeded shuffle of ``sentences`` (a throughput set)."""
    order = np.random.default_rng(seed).permutation(len(sentences))
    return [sentences[order[i % len(order)]] for i in range(n)]


def long_texts(sentences: Sequence[str], n: int, seed: int = 0, per_text: tuple[int, int] = (6, 14)) -> list[str]:
    """``n`` paragraph-length texts (6-14 sentences joined, about 80-250 tokens): the longer-text set."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(per_text[0], per_text[1] + 1))
        start = int(rng.integers(0, max(1, len(sentences) - k)))
        out.append(" ".join(sentences[start : start + k]))
    return out


# -- models -------------------------------------------------------------------------------------------------


def build_random_model(arch: str, tokenizer_dir: str | Path, out_dir: str | Path, seed: int = 0) -> Path:
    """Save a random-weight BERT of a known architecture (:data:`MODEL_CONFIGS`) with a local tokenizer.

    Speed does not depend on the weights, so this stands in for bert-base / all-MiniLM-L6-v2 where there is no
    network. ``tokenizer_dir`` holds ``vocab.txt`` or ``tokenizer.json`` (e.g. the packaged default model's).
    """
    from transformers import AutoTokenizer, BertConfig, BertModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **MODEL_CONFIGS[arch])
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def model_flops(config: Any, lengths: np.ndarray) -> float:
    """Useful forward FLOPs of an encoder over sentences of ``lengths`` tokens (no padding counted).

    Per token: ``2 L (4 d^2 + 2 d d_ff)`` for the matrix products, plus ``4 L T d`` for attention (Q K^T and
    A V) in a sequence of T tokens; embeddings are lookups and the pooler is ignored.
    """
    layers, d, d_ff = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    lengths = np.asarray(lengths, dtype=np.float64)
    per_token = 2 * layers * (4 * d * d + 2 * d * d_ff)
    return float((lengths * per_token + 4 * layers * d * lengths**2).sum())


def st_padded_tokens(lengths: np.ndarray, texts: Sequence[str], batch_size: int) -> int:
    """Padded tokens of ``SentenceTransformer.encode``: sorted by *character* length, fixed-size batches."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    lengths = np.asarray(lengths)[order]
    return int(sum(len(b) * b.max() for b in np.array_split(lengths, math.ceil(len(lengths) / batch_size))))


# -- timing -------------------------------------------------------------------------------------------------


def sync() -> None:
    """Wait for queued CUDA work (no-op without CUDA): a timer must not stop before the GPU does."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleave(
    runs: dict[str, Callable[[], Any]],
    rounds: dict[str, int] | int,
    around: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
) -> dict[str, list[float]]:
    """Time each callable ``rounds`` times, alternating their order round by round (A B, B A, A B ...; the first
    round in the order of ``runs``). ``around(name)``, if given, is entered before each run and left after it,
    outside the timed window (to read counters around a run without timing them).

    Returns:
        seconds per run, by name. A name with fewer rounds than others drops out of the later rounds.
    """
    counts = {name: rounds if isinstance(rounds, int) else rounds[name] for name in runs}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(max(counts.values())):
        names = [n for n in runs if counts[n] > r]
        for name in names if r % 2 == 0 else names[::-1]:
            with around(name) if around is not None else contextlib.nullcontext():
                sync()
                start = time.perf_counter()
                runs[name]()
                sync()
                times[name].append(time.perf_counter() - start)
    return times


def environment(device: str) -> dict[str, Any]:
    """The machine record of reports (:func:`bertflow.resources.machine_info`: platform, CPU, usable cores, library
    versions, GPU) plus the load average and the tokenizers and sentence-transformers versions."""
    import tokenizers

    from bertflow.resources import machine_info

    env: dict[str, Any] = {
        **machine_info(device),
        "tokenizers": tokenizers.__version__,
        "load_average": os.getloadavg(),
    }
    try:
        import sentence_transformers

        env["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        pass
    return env


def save_json(results: dict[str, Any], path: str | Path) -> None:
    """Write results as indented JSON (atomically: a partial run never leaves a broken file)."""
    from bertflow.io.files import atomic_write_text

    atomic_write_text(path, json.dumps(results, indent=1, default=str))
