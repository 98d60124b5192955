"""Shared test material for the STS evaluator and the paper harness: a tiny BERT whose tokenizer knows its
vocabulary, a synthetic STS data folder in bertflow's TSV layout, and an in-process CLI call."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertflow.cli import app

runner = CliRunner()

WORDS = (
    "the a man woman dog cat plays playing guitar music on runs park child ball red blue car street house eats "
    "food apple reads book sits bench walks beach sun bright river boat"
).split()


def _tokenizer_for(vocab_file: Path):  # noqa: ANN202 - a PreTrainedTokenizerFast
    """A BERT-style fast tokenizer over ``vocab_file`` built with the ``tokenizers`` library (version-proof)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(vocab_file.read_text(encoding="utf-8").split())}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():  # noqa: ANN201 - a generator fixture
    """Run the tiny model on one thread: its ops are too small to gain from two, and when other processes hold the
    cores, intra-op thread barriers make each forward pass wait for a scheduler slice (~60x slower here)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def working_tiny_bert(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conftest's tiny random BERT with a tokenizer that knows its vocabulary.

    The fixture's own saved tokenizer maps every word to [UNK] under transformers 5 (``BertTokenizerFast`` no
    longer reads ``vocab_file``), so every sentence of a given length would embed identically and correlations
    would be degenerate. Same weights, working WordPiece tokenizer.
    """
    folder = tmp_path_factory.mktemp("tiny-bert-vocab")
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        shutil.copy(tiny_model_dir / name, folder / name)
    _tokenizer_for(folder / "vocab.txt").save_pretrained(folder)
    return folder


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) + "."


def _pair(rng: random.Random) -> tuple[str, str, str]:
    a = _sentence(rng)
    words = a[:-1].split()
    b_words = words
    while b_words == words:  # identical sentences would tie at cosine 1 and make ranks rounding-dependent
        keep = rng.randint(0, len(words) - 1)
        b_words = words[:keep] + [rng.choice(WORDS) for _ in range(len(words) - keep)]
    overlap = len(set(words) & set(b_words)) / len(set(words) | set(b_words))
    return f"{5 * overlap:.2f}", a, " ".join(b_words) + "."


def write_sts_layout(root: Path, n: int = 24, seed: int = 0) -> Path:
    """A synthetic STS data folder in bertflow's TSV layout: every task, small, gold = 5 x word Jaccard."""
    rng = random.Random(seed)
    files = {
        "STS12/MSRpar.tsv": n,
        "STS12/OnWN.tsv": n,
        "STS13/FNWN.tsv": n,
        "STS14/images.tsv": n,
        "STS15/belief.tsv": n,
        "STS16/headlines.tsv": n,
        "STS16/plagiarism.tsv": n // 2,
        "STSBenchmark/train.tsv": n,
        "STSBenchmark/dev.tsv": n // 2,
        "STSBenchmark/test.tsv": n,
        "SICK/train.tsv": n,
        "SICK/trial.tsv": n // 2,
        "SICK/test.tsv": n,
    }
    for rel, k in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [_pair(rng) for _ in range(k)]
        path.write_text("score\tsentence1\tsentence2\n" + "".join(f"{s}\t{a}\t{b}\n" for s, a, b in rows))
    for rel in ("NLI/snli_dev.tsv", "NLI/snli_test.tsv"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # "!" keeps the NLI sentences apart from the STS ones (which end in "."), so "seen" counts are exact.
        rows = [("neutral", _sentence(rng)[:-1] + "!", _sentence(rng)[:-1] + "!") for _ in range(n)]
        path.write_text("label\tsentence1\tsentence2\n" + "".join(f"{s}\t{a}\t{b}\n" for s, a, b in rows))
    return root


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sts_layout(tmp_path_factory.mktemp("sts"))


@pytest.fixture(scope="module")
def encoder(working_tiny_bert: Path):  # noqa: ANN201 - a SentenceEncoder
    """The working tiny BERT, mean pooling, on the CPU."""
    from bertflow import SentenceEncoder

    return SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu")


def per_set_config(layout: Path, **kwargs: object):  # noqa: ANN201 - a GridConfig
    """A GridConfig of the per-set protocol on ``layout`` without the embedding cache, changed by ``kwargs``."""
    from bertflow.paper.grid import GridConfig

    return GridConfig(**{"regimes": ["per-set"], "data_dir": layout, "use_cache": False, **kwargs})  # type: ignore[arg-type]


def _invoke(*args: object):
    from bertflow.errors import BertflowError

    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, (SystemExit, BertflowError)):
        raise result.exception
    return result
