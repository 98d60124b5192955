"""`bertflow search build` / `search query` end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bertflow import Embedder
from bertflow.cli import EXIT_USAGE, app

from .conftest import CORPUS
from .test_conventions import cli

runner = CliRunner()


@pytest.mark.slow
def test_search_build_and_query_read_standard_input(tiny_encoder, corpus, tmp_path):
    from bertflow import WhiteningCalibrator

    model = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(CORPUS).save(tmp_path / "model")
    proc = cli("search", "build", "-", "--model-dir", model, "-o", tmp_path / "idx", "-q", stdin=corpus.read_bytes())
    assert proc.returncode == 0, proc.stderr
    queries = f"{CORPUS[3]}\n{CORPUS[40]}\n".encode()
    proc = cli("search", "query", tmp_path / "idx", "-", "--json", "-k", "1", stdin=queries)
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [a["query"] for a in answers] == [CORPUS[3], CORPUS[40]]
    assert [a["hits"][0]["id"] for a in answers] == [4, 41]  # ids are 1-based line numbers of the stdin corpus
    r = runner.invoke(app, ["search", "query", str(tmp_path / "idx"), "-", "-"])
    assert r.exit_code == EXIT_USAGE and "may be given once" in r.stderr
