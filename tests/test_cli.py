"""The `bertflow` command, driven as a user would (typer's runner, in-process)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow.cli import app

from .conftest import SENTENCES, invoke

runner = CliRunner()


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(f"{a} {b}" for a in SENTENCES for b in SENTENCES) + "\n", encoding="utf-8")
    return path


def test_fit_encode_similarity(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "model"
    r = invoke("fit", corpus, "-o", out, "--model", tiny_model_dir, "--calibrator", "standard-norm", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["sentences"] == 64
    r = invoke("encode", corpus, "-o", tmp_path / "z.npy", "--model-dir", out, "-q")
    assert r.exit_code == 0, r.output
    z = np.load(tmp_path / "z.npy")
    assert z.shape == (64, 32) and np.isfinite(z).all()
    from bertflow import Embedder

    lines = corpus.read_text().splitlines()
    np.testing.assert_allclose(z, Embedder.load(out).encode(lines), atol=1e-5)
    r = invoke("similarity", "The cat sleeps.", "The cat sleeps.", "--model-dir", out)
    assert r.exit_code == 0 and float(r.stdout) == pytest.approx(1.0, abs=1e-5)


def test_similarity_pairs_file(tiny_model_dir, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "score\tsentence1\tsentence2\n"
        + "".join(f"{i % 5}\t{SENTENCES[i]}\t{SENTENCES[-1 - i]}\n" for i in range(len(SENTENCES))),
        encoding="utf-8",
    )
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-o", tmp_path / "out.tsv")
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "out.tsv").read_text().splitlines()
    # The cosine, then the input's columns unchanged.
    assert rows[0] == "cosine\tscore\tsentence1\tsentence2" and len(rows) == len(SENTENCES) + 1
    assert rows[1].split("\t")[1:] == ["0", SENTENCES[0], SENTENCES[-1]]
    assert "spearman" in r.stderr


def test_similarity_pairs_without_score_keeps_extra_columns(tiny_model_dir, tmp_path):
    """Only sentence1 and sentence2 are required; an id (or any column) travels with its pair, in input order."""
    pairs = tmp_path / "pairs.tsv"
    rows_in = [(f"q{i}", SENTENCES[i], SENTENCES[-1 - i]) for i in range(4)]
    pairs.write_text(
        "sentence1\tid\tsentence2\n" + "".join(f"{a}\t{i}\t{b}\n" for i, a, b in rows_in), encoding="utf-8"
    )
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q")
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    assert out[0] == "cosine\tsentence1\tid\tsentence2" and len(out) == 5
    from bertflow import Embedder, SentenceEncoder
    from bertflow.calibrators import IdentityCalibrator

    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), pooling="mean"), IdentityCalibrator())
    expected = embedder.similarity_pairwise([a for _, a, _ in rows_in], [b for _, _, b in rows_in])
    for line, (i, a, b), cos in zip(out[1:], rows_in, expected, strict=True):
        fields = line.split("\t")
        assert fields[1:] == [a, i, b]
        assert float(fields[0]) == pytest.approx(float(cos), abs=2e-6)
    assert "spearman" not in r.stderr  # no score column, no correlation
    pairs.write_text("sentence1\tid\n" + "a\t1\n", encoding="utf-8")
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir)
    assert r.exit_code == 2 and "columns sentence1 and sentence2" in r.stderr and len(r.stderr.splitlines()) == 1


def test_version():
    from bertflow import __version__

    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"bertflow {__version__}"


def test_calibrator_help_lists_every_spec():
    import typer

    from bertflow.calibrators import calibrator_specs

    commands = typer.main.get_command(app).commands
    for name, option in (("fit", "calibrator"), ("evaluate", "calibrator")):
        (param,) = [p for p in commands[name].params if p.name == option]
        listed = param.help.split(",")[0].split(" | ")
        assert listed == list(calibrator_specs()), name  # "anchored", "anchored-P", "auto" among them


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "CORPUS", "-o", "OUT", "--calibrator", "standard-norm"],
        ["encode", "CORPUS", "-o", "OUT.npy"],
        ["similarity", "a b", "c d"],
    ],
)
def test_threads_option_sets_torch_threads(tiny_model_dir, corpus, tmp_path, args, monkeypatch):
    import torch

    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)  # the process's own setting stays untouched
    args = [str(corpus) if a == "CORPUS" else str(tmp_path / a) if a.startswith("OUT") else a for a in args]
    r = invoke(*args, "--model", tiny_model_dir, "--threads", "1", *(["-q"] if args[0] != "similarity" else []))
    assert r.exit_code == 0, r.output
    assert seen == [1]
    args = [a + "2" if a.startswith(str(tmp_path / "OUT")) else a for a in args]
    r = invoke(*args, "--model", tiny_model_dir, "--threads", "0")
    assert r.exit_code == 2 and "--threads must be at least 1" in r.stderr and seen == [1]


def test_search_threads_and_quiet(tiny_model_dir, corpus, tmp_path, monkeypatch):
    import torch

    model = tmp_path / "model"
    r = invoke("fit", corpus, "-o", model, "--model", tiny_model_dir, "--calibrator", "whitening", "-q")
    assert r.exit_code == 0, r.output
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    r = invoke("search", "build", corpus, "--model-dir", model, "-o", tmp_path / "idx", "--threads", "2", "-q")
    assert r.exit_code == 0, r.output
    from bertflow import EmbeddingIndex

    calls = []
    query = EmbeddingIndex.query
    monkeypatch.setattr(EmbeddingIndex, "query", lambda self, *a, **kw: calls.append(kw) or query(self, *a, **kw))
    for extra, bar in (([], None), (["-q"], False)):  # None: a bar for 4,096 queries or more; -q: never
        r = invoke("search", "query", tmp_path / "idx", "The cat sleeps.", "-k", "1", "--threads", "1", *extra)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith("# The cat sleeps.\n1\t") and calls[-1]["show_progress_bar"] is bar
    assert seen == [2, 1, 1]


def test_download_sts_quiet(tmp_path):
    """A completed download is not redone: without -q the progress line says so on stderr, with -q nothing."""
    from bertflow.evaluation.download import _COMPLETE_MARKER

    (tmp_path / _COMPLETE_MARKER).write_text("complete\n")
    r = invoke("download-sts", "-o", tmp_path)
    assert r.exit_code == 0 and r.stdout.strip() == str(tmp_path)
    assert "already downloaded" in r.stderr
    r = invoke("download-sts", "-o", tmp_path, "-q")
    assert r.exit_code == 0 and r.stdout.strip() == str(tmp_path) and r.stderr == ""


def test_model_dir_typo_is_one_line_no_such_folder(tmp_path, monkeypatch):
    """A mistyped local folder is not looked up on the Hub (which would answer with a network error)."""
    (tmp_path / "runs" / "my-flow").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for typo in ("my-flwo", "./my-flwo", "runs/my-flwo"):
        r = invoke("similarity", "a b", "c d", "--model-dir", typo)
        assert r.exit_code == 2 and r.stderr.startswith(f"bertflow: error: no such folder: {typo}"), r.stderr
        assert len(r.stderr.splitlines()) == 1 and "Hub" not in r.stderr
    assert "did you mean runs/my-flow?" in invoke("similarity", "a b", "c d", "--model-dir", "runs/my-flwo").stderr


def test_fit_from_tsv_columns(tiny_model_dir, tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text(
        "score\tsentence1\tsentence2\n" + "".join(f"1\t{a} {b}\t{b} {a}\n" for a in SENTENCES for b in SENTENCES[:5]),
        encoding="utf-8",
    )
    r = invoke(
        "fit",
        tsv,
        "-c",
        "sentence1",
        "-c",
        "sentence2",
        "-o",
        tmp_path / "m",
        "--model",
        tiny_model_dir,
        "--calibrator",
        "standard-norm",
        "-q",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["sentences"] == 80
    r = invoke("fit", tsv, "-c", "nope", "-o", tmp_path / "m2", "--model", tiny_model_dir)
    assert r.exit_code == 2 and "nope" in r.stderr


def test_bad_utf8_is_a_clear_error(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nsecond \xff line\n")
    r = invoke("encode", bad, "-o", tmp_path / "x.npy", "--model", tiny_model_dir, "-q")
    assert r.exit_code == 2
    assert "line 2" in r.stderr and "--encoding-errors replace" in r.stderr
    assert not (tmp_path / "x.npy").exists()
    r = invoke("encode", bad, "-o", tmp_path / "x.npy", "--model", tiny_model_dir, "-q", "--encoding-errors", "replace")
    assert r.exit_code == 0 and np.load(tmp_path / "x.npy").shape == (2, 32)


def test_user_errors_exit_2(tiny_model_dir, tmp_path, corpus):
    r = invoke("similarity", "only one", "--model", tiny_model_dir)
    assert r.exit_code == 2 and "exactly two" in r.stderr
    r = invoke("fit", corpus, "-o", tmp_path / "m", "--model", tiny_model_dir, "--pooling", "max")
    assert r.exit_code == 2 and "unknown pooling" in r.stderr
    r = invoke("encode", corpus, "-o", tmp_path / "x.npy", "--model-dir", tmp_path / "missing")
    assert r.exit_code == 2


def test_help_has_examples():
    for cmd in ("fit", "encode", "similarity"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Examples" in r.stdout


def test_every_command_has_quiet_and_the_encoding_ones_threads():
    """The README promises -q on every command; --threads goes with every command that encodes sentences."""
    import typer

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), {opt for p in command.params for opt in getattr(p, "opts", [])}

    commands = dict(walk(typer.main.get_command(app), []))
    assert len(commands) >= 11
    assert [name for name, opts in commands.items() if "-q" not in opts or "--quiet" not in opts] == []
    for name in ("fit", "encode", "similarity", "search build", "search query", "evaluate", "reproduce", "analyze"):
        assert "--threads" in commands[name], name


def test_similarity_pairs_progress_bar_unless_quiet(tiny_model_dir, tmp_path):
    """Even a small file gets a bar with rate and ETA on stderr (stdout stays the TSV); -q turns it off."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\n" + f"{SENTENCES[0]}\t{SENTENCES[1]}\n", encoding="utf-8")
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir)
    assert r.exit_code == 0, r.output
    assert "similarity: 100%" in r.stderr and "2/2" in r.stderr and "similarity:" not in r.stdout
    r = invoke("similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q")
    assert r.exit_code == 0 and "similarity:" not in r.stderr
