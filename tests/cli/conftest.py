"""Shared by the CLI end-to-end tests: a corpus file of 64 distinct sentences."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import CORPUS


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path
