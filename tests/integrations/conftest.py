"""Shared pieces of the sentence-transformers tests: a tiny SentenceTransformer, its corpus, and a fresh interpreter
without bertflow that reloads exported folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from ..conftest import SENTENCES

if TYPE_CHECKING:  # imported where used: the other integrations' tests run without sentence-transformers
    from sentence_transformers import SentenceTransformer

# Distinct token counts: the tiny fixture's tokenizer maps every word to [UNK] under transformers 5.
WORDS = " ".join(SENTENCES * 2).split()
CORPUS = [" ".join(WORDS[:n]) for n in range(1, 65)]

# Runs in a fresh interpreter that cannot import bertflow (a meta-path finder refuses it before any other import),
# as on a machine with only sentence-transformers installed. Arguments: pairs of (the lines that load a saved folder
# as ``model``, expected .npy); prints the largest |difference| over all folders.
_PLAIN_LOAD = """
import sys, importlib.abc
class NoBertflow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "bertflow" or name.startswith("bertflow."):
            raise ImportError("bertflow is not installed here")
sys.meta_path.insert(0, NoBertflow())
import numpy as np
worst = 0.0
for card_lines, expected in zip(sys.argv[1::2], sys.argv[2::2]):
    expected, scope = np.load(expected), {}
    exec(card_lines, scope)
    model = scope["model"]
    worst = max(worst, float(np.abs(model.encode(SENTENCES) - expected).max()))
assert not any(m.startswith("bertflow") for m in sys.modules), "bertflow was imported"
print(worst)
"""


def plain_load(folder: Path) -> str:
    """The lines that load ``folder`` with plain sentence-transformers, as ``model``."""
    return f"from sentence_transformers import SentenceTransformer\nmodel = SentenceTransformer({str(folder)!r})"


def worst_without_bertflow(loads: list[tuple[str, np.ndarray]], tmp_path: Path) -> float:
    """Run each ``(load lines, expected)`` in one fresh interpreter that cannot import bertflow: the largest
    |difference| between ``model.encode(CORPUS[:10])`` and its expected [10, D] array, over all of them."""
    args = []
    for n, (load, expected) in enumerate(loads):
        np.save(tmp_path / f"expected{n}.npy", expected)
        args += [load, str(tmp_path / f"expected{n}.npy")]
    code = f"SENTENCES = {CORPUS[:10]!r}\n{_PLAIN_LOAD}"
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-I", "-c", code, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


def tiny_st(folder, normalize: bool = True, max_seq_length: int = 64) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    modules = [Transformer(str(folder), max_seq_length=max_seq_length), Pooling(32, "mean")]
    return SentenceTransformer(modules=[*modules, Normalize()] if normalize else modules, device="cpu")


@pytest.fixture(scope="module")
def base(tiny_model_dir) -> SentenceTransformer:
    return tiny_st(tiny_model_dir)


def pooled(model: SentenceTransformer) -> np.ndarray:
    """The base model's embeddings before its final Normalize: what the calibrator must see."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(modules=list(model)[:2], device="cpu").encode(CORPUS[:10])


def card_load_line(folder) -> str:
    """The model card's usage snippet, install comment and load line, aimed at the local ``folder``."""
    card = (folder / "README.md").read_text()
    snippet = card[card.index("```python\nfrom") :] if "```python\nfrom" in card else card[card.index("```python\n#") :]
    snippet = snippet[len("```python\n") : snippet.index("```", 10)]
    lines = [ln for ln in snippet.splitlines() if ln.startswith(("from sentence_transformers", "model = "))]
    assert len(lines) == 2, snippet
    return "\n".join(lines).replace('"sentence_transformers_model_id"', repr(str(folder)))


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)
