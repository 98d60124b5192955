"""Shared fixtures: a tiny random-weight BERT saved as a real Hugging Face folder (no download), real data paths."""

from __future__ import annotations

import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sts"

SENTENCES = [
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "Someone plays music on a guitar.",
    "The stock market fell sharply today.",
    "A dog runs across the park.",
    "Two children are playing football outside.",
    "The cat sleeps.",
    "A plane is taking off from the airport runway while people watch.",
]
#: 64 distinct two-sentence lines: the corpus of the CLI files and of ``saved_model``.
CORPUS = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]


def _write_vocab(folder: Path) -> None:
    words = ["the", "a", "man", "woman", "is", "playing", "guitar", "dog", "cat", "music", "plays", "on"]
    letters = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters, *[f"##{c}" for c in letters]]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")


def make_tiny_bert(folder: Path, seed: int = 0, hidden: int = 32, layers: int = 3) -> Path:
    """Save a random-weight BertModel + fast tokenizer into ``folder`` and return it."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    _write_vocab(folder)
    # transformers 5 ignores `vocab_file=` here (every word became [UNK]); `vocab=` takes the file.
    tokenizer = BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    config = BertConfig(
        vocab_size=len((folder / "vocab.txt").read_text().split()),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def other_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and dimension as ``tiny_model_dir``, different weights."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert-other"), seed=1)


@pytest.fixture(scope="session")
def tiny_encoder(tiny_model_dir: Path):
    from bertflow import SentenceEncoder

    return SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu")


@pytest.fixture()
def anisotropic_data() -> np.ndarray:
    """[400, 12] correlated, shifted, non-Gaussian data (a stand-in for embeddings in a cone)."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(400, 12)) @ rng.normal(size=(12, 12))
    return base + 0.3 * base**2 / 10 + 5.0


def shared_data_dir() -> Path | None:
    """The STS data: $BERTFLOW_DATA_DIR if set, else ../shared/data/sts beside the checkout (never copied in)."""
    env = os.environ.get("BERTFLOW_DATA_DIR")
    for candidate in ([Path(env)] if env else []) + [DATA_DIR]:
        if (candidate / "STS12").is_dir():
            return candidate
    return None


@pytest.fixture(scope="module")
def sts_dir() -> Path:
    found = shared_data_dir()
    if found is None:
        pytest.skip(f"STS data not found at {DATA_DIR} (set BERTFLOW_DATA_DIR to a copy)")
    return found


def write_file(path: Path, content: str | bytes) -> Path:
    """Write ``content`` (UTF-8 for a str) to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"STS data not found at {DATA_DIR}")
    return DATA_DIR


@pytest.fixture(scope="session")
def default_encoder():
    """The real packaged all-MiniLM-L6-v2 (mean pooling)."""
    from bertflow import SentenceEncoder

    return SentenceEncoder(pooling="mean", device="cpu")


# -- the CLI, run in-process or as a command -----------------------------------------------------------------------


def invoke(*args: object):
    """``bertflow ARGS`` in this process; a bug (any exception but an exit or a BertflowError) is raised, not left in
    the result."""
    from typer.testing import CliRunner

    from bertflow.cli import app
    from bertflow.errors import BertflowError

    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, (SystemExit, BertflowError)):
        raise result.exception
    return result


def cli(*args: object, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m bertflow ARGS`` in a process of its own (the real entry point and standard streams), offline, on
    one thread."""
    from .safety import SRC

    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, "-m", "bertflow", *map(str, args)]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=300, env=env, cwd=cwd)


def one_line_error(result, *needles: str, status: int = 2) -> str:
    """Exit ``status`` (2: usage error, 1: runtime error such as a full disk), one ``bertflow: error:`` line naming
    the problem, no traceback; returns the line."""
    assert result.exit_code == status, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("bertflow: error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes (to show that a refused command left it as it was)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """``CORPUS`` as a text file, one sentence a line."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def saved_model(tiny_encoder, tmp_path) -> Path:
    """A standard-norm model fitted on ``CORPUS``, saved to ``tmp_path / "model"``: its folder."""
    from bertflow import Embedder
    from bertflow.calibrators import StandardNormCalibrator

    return Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS).save(tmp_path / "model")


@pytest.fixture()
def model_a(tiny_encoder, tmp_path) -> Path:
    """A whitening model (fit_info regime "A") saved to ``tmp_path / "model-a"``; ``model_b`` is another one."""
    from bertflow import Embedder, WhiteningCalibrator

    emb = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
    emb.fit_info["regime"] = "A"
    return emb.save(tmp_path / "model-a")


@pytest.fixture()
def model_b(tiny_encoder, tmp_path) -> Path:
    from bertflow import Embedder, StandardNormCalibrator

    emb = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    emb.fit_info["regime"] = "B"
    return emb.save(tmp_path / "model-b")


@pytest.fixture()
def no_model_loading(monkeypatch):
    """Fail the test if a command gets as far as loading weights."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad option was reported")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refuse)
