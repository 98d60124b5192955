"""`bertflow search build` / `search query` end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bertflow import Embedder, EmbeddingIndex, WhiteningCalibrator
from bertflow.cli import EXIT_USAGE, app
from bertflow.search.sentences import index_sentences

from ..conftest import CORPUS, cli, invoke, one_line_error, snapshot
from ..safety import fit_args
from ..search.conftest import CORPUS as SEARCH_CORPUS  # the prefixes corpus of the index tests
from ..search.conftest import model, needs_faiss  # noqa: F401 - the fixture

runner = CliRunner()


@pytest.mark.slow
def test_search_build_and_query_read_standard_input(tiny_encoder, corpus, tmp_path):
    from bertflow import WhiteningCalibrator

    model = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(CORPUS).save(tmp_path / "model")  # noqa: F811
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


def test_cli_build_and_query(model, tmp_path):  # noqa: F811
    model_dir = model.save(tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SEARCH_CORPUS) + "\n", encoding="utf-8")
    r = invoke("search", "build", corpus, "--model-dir", model_dir, "-o", tmp_path / "idx", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["rows"] == len(SEARCH_CORPUS)
    # No --model-dir: the index remembers the model folder it was built with.
    r = invoke("search", "query", tmp_path / "idx", SEARCH_CORPUS[7], SEARCH_CORPUS[9], "--top-k", "2")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"# {SEARCH_CORPUS[7]}" and lines[1].split("\t")[2:] == [
        "8",
        SEARCH_CORPUS[7],
    ]  # id = line number
    assert len(lines) == 6
    queries = tmp_path / "q.txt"
    queries.write_text(SEARCH_CORPUS[20] + "\n", encoding="utf-8")
    r = invoke("search", "query", tmp_path / "idx", "--queries", queries, "--json", "-k", "1", "--model-dir", model_dir)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["hits"][0]["text"] == SEARCH_CORPUS[20]


def test_cli_errors_exit_2(model, tiny_encoder, tmp_path):  # noqa: F811
    model_dir = model.save(tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SEARCH_CORPUS) + "\n", encoding="utf-8")
    assert invoke("search", "build", corpus, "--model-dir", model_dir, "-o", tmp_path / "idx", "-q").exit_code == 0
    r = invoke("search", "query", tmp_path / "idx")
    assert r.exit_code == 2 and "query sentences" in r.stderr
    other = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(SEARCH_CORPUS).save(tmp_path / "other")
    r = invoke("search", "query", tmp_path / "idx", "hello", "--model-dir", other)
    assert r.exit_code == 2 and "rebuild the index" in r.stderr
    r = invoke("search", "build", corpus, "--model-dir", model_dir, "-o", tmp_path / "i2", "--backend", "annoy")
    one_line_error(r, "'--backend'", "'annoy' is not one of 'torch', 'faiss'")
    r = invoke("search", "build", corpus, "--model-dir", model_dir, "-o", tmp_path / "i3", "--approximate", "lsh")
    one_line_error(r, "'--approximate'", "'lsh' is not one of 'auto', 'exact', 'hnsw', 'ivf'")
    assert not (tmp_path / "i3").exists()


def test_cli_help_has_examples():
    for cmd in ("build", "query"):
        r = runner.invoke(__import__("bertflow.cli", fromlist=["app"]).app, ["search", cmd, "--help"])
        assert r.exit_code == 0 and "Examples" in r.stdout


@needs_faiss
def test_cli_build_records_approximate(model, tmp_path):  # noqa: F811
    model_dir = model.save(tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SEARCH_CORPUS) + "\n", encoding="utf-8")
    r = invoke(
        "search", "build", corpus, "--model-dir", model_dir, "-o", tmp_path / "idx", "--approximate", "hnsw", "-q"
    )
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["search"] == "hnsw" and summary["recall"]["kind"] == "hnsw"  # the recall is reported
    assert 0 <= summary["recall"]["recall_at_k"] <= 1 and summary["recall"]["sample"] == len(SEARCH_CORPUS)
    assert EmbeddingIndex.load(tmp_path / "idx").approximate == "hnsw"
    r = invoke("search", "query", tmp_path / "idx", SEARCH_CORPUS[5], "--json", "-k", "1")
    assert r.exit_code == 0 and json.loads(r.stdout)["hits"][0]["text"] == SEARCH_CORPUS[5]


def test_search_query_does_not_blame_the_index_for_a_bad_backend_or_a_model_folder(saved_model, tmp_path):
    index = index_sentences(Embedder.load(saved_model), CORPUS[:6]).save(tmp_path / "idx")
    one_line_error(invoke("search", "query", index, "a man", "--backend", "bogus", "-q"), "--backend", "'bogus'")
    line = one_line_error(invoke("search", "query", saved_model, "a man", "-q"), "model folder, not a search index")
    assert "damaged" not in line and "missing" not in line
    r = invoke("search", "query", index, "a man", "-q", "--top-k", "2")
    assert r.exit_code == 0, r.output


def test_search_threads_and_quiet(tiny_model_dir, corpus, tmp_path, monkeypatch):
    import torch

    model = tmp_path / "model"  # noqa: F811
    r = invoke("fit", corpus, "-o", model, "--model", tiny_model_dir, "--calibrator", "whitening", "-q")
    assert r.exit_code == 0, r.output
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    r = invoke("search", "build", corpus, "--model-dir", model, "-o", tmp_path / "idx", "--threads", "2", "-q")
    assert r.exit_code == 0, r.output
    from bertflow.search import sentences

    calls = []
    query = sentences.query
    monkeypatch.setattr(sentences, "query", lambda *a, **kw: calls.append(kw) or query(*a, **kw))
    for extra, bar in (([], None), (["-q"], False)):  # None: a bar for 4,096 queries or more; -q: never
        r = invoke("search", "query", tmp_path / "idx", "The cat sleeps.", "-k", "1", "--threads", "1", *extra)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith("# The cat sleeps.\n1\t") and calls[-1]["show_progress_bar"] is bar
    assert seen == [2, 1, 1]


def test_search_build_refuses_to_replace_the_model(model_a, corpus, tmp_path):
    before = snapshot(model_a)
    r = invoke("search", "build", corpus, "--model-dir", model_a, "-o", model_a, "-q", "--overwrite")
    one_line_error(r, "holds the input")
    assert snapshot(model_a) == before
    # An index is not a model and a model is not an index, whatever --overwrite says.
    idx = tmp_path / "idx"
    assert invoke("search", "build", corpus, "--model-dir", model_a, "-o", idx, "-q").exit_code == 0
    one_line_error(invoke("search", "build", corpus, "--model-dir", model_a, "-o", idx, "-q"), "--overwrite")
    assert invoke("search", "build", corpus, "--model-dir", model_a, "-o", idx, "-q", "--overwrite").exit_code == 0
    one_line_error(invoke(*fit_args(corpus, idx, model_a), "--overwrite"), "search index")
