"""`bertflow evaluate`, `bertflow reproduce` (bertflow.cli.evaluate) end to end on a tiny BERT and a synthetic STS
layout: reports, regimes, saved models, the per-set protocol with its selection, refusals before any work; the
command echo of a report; the default STS data folder (``--data-dir`` not given: ``$BERTFLOW_DATA_DIR``, then
./shared/data/sts, ../shared/data/sts relative to the working directory, then ~/.cache/bertflow/sts; the library
searches nothing)."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertflow import SentenceEncoder
from bertflow.cli.evaluate import DATA_DIR_CANDIDATES, find_data_dir
from bertflow.errors import DataNotFoundError
from bertflow.evaluation.datasets import DATA_DIR_ENV, load_nli_sentences
from bertflow.paper.published import published_for

from ..sts_layout import _invoke, layout, one_torch_thread, working_tiny_bert  # noqa: F401 - fixtures


def test_cli_reproduce_writes_markdown_and_json(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid"
    r = _invoke(
        "reproduce", "--model", working_tiny_bert, "--poolings", "mean,first-last-avg", "--calibrators",
        "none,whitening", "--regimes", "target,train", "--data-dir", layout, "--cache-dir", tmp_path / "c",
        "-o", out, "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "reproduce.json").read_text())
    assert [(c["pooling"], c["calibrator"], c["regime"]) for c in data["cells"]] == [
        ("mean", "none", "none"),
        ("mean", "whitening", "target"),
        ("mean", "whitening", "train"),
        ("first-last-avg", "none", "none"),
        ("first-last-avg", "whitening", "target"),
        ("first-last-avg", "whitening", "train"),
    ]
    md = (out / "reproduce.md").read_text()
    assert md == r.stdout
    assert "bertflow reproduce --model" in md and "--regimes target,train" in md
    assert data["meta"]["regimes"]["train"].startswith("per task, train split only")


def test_cli_reproduce_corpus_from_gzip_with_stand_in_paper_rows(
    working_tiny_bert: Path, layout: Path, tmp_path: Path
) -> None:
    import gzip

    sentences = load_nli_sentences(layout)
    plain = tmp_path / "corpus.txt"
    plain.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    runs = {}
    for corpus in (plain, packed):
        out = tmp_path / f"grid-{corpus.name}"
        r = _invoke(
            "reproduce", "--model", working_tiny_bert, "--poolings", "mean", "--calibrators", "none,standard-norm",
            "--regimes", "corpus", "--corpus", corpus, "--tasks", "STS-B,SICK-R", "--data-dir", layout, "--no-cache",
            "--paper-rows", "bert-base-uncased", "-o", out, "-q",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        runs[corpus.name] = json.loads((out / "reproduce.json").read_text())
    cells = {name: [c["average"] for c in d["cells"]] for name, d in runs.items()}
    assert cells["corpus.txt"] == cells["corpus.txt.gz"]  # the .gz file is read as the plain one
    data = runs["corpus.txt.gz"]
    assert f"({len(set(sentences))} sentences)" in data["meta"]["regimes"]["corpus"]
    # A model the papers did not evaluate gets bert-base's rows only when asked, captioned with how they differ.
    assert data["meta"]["published"]["model"] == "bert-base-uncased"
    assert len(data["published"]) == len(published_for("bert-base-uncased"))
    md = (tmp_path / "grid-corpus.txt.gz" / "reproduce.md").read_text()
    caption = data["meta"]["published"]["caption"]
    assert caption in md and "not this encoder's" in caption and "12 layers, hidden 768" in caption
    assert f"{SentenceEncoder(str(working_tiny_bert)).num_layers} layers" in caption
    assert "--paper-rows bert-base-uncased" in md and "paper's bert-base-uncased (protocol; source)" in md
    raw_row = next(line for line in md.splitlines() if line.startswith("| mean | none | none |"))
    assert "(wmean" in raw_row  # the paper's raw last-avg row sits beside ours
    bad = _invoke("reproduce", "--model", working_tiny_bert, "--paper-rows", "gpt2", "--data-dir", layout, "-q")
    assert bad.exit_code == 2 and "no published rows for 'gpt2'" in bad.output


def test_cli_evaluate_regimes_and_saved_model(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(load_nli_sentences(layout)) + "\n", encoding="utf-8")
    r = _invoke(
        "evaluate", "--model", working_tiny_bert, "--calibrator", "standard-norm", "--corpus", corpus,
        "--tasks", "STS-B,STS12", "--data-dir", layout, "--no-cache", "-o", tmp_path / "ev", "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "ev" / "evaluate.json").read_text())
    cal = data["cells"][1]
    assert cal["regime"] == "corpus" and cal["test_sentences_seen_summary"] == "none"
    assert set(cal["tasks"]) == {"STS-B", "STS12"} and len(cal["tasks"]["STS12"]["subsets"]) == 2
    assert "corpus.txt" in data["meta"]["regimes"]["corpus"]
    assert "## Per subset" in r.stdout and "MSRpar" in r.stdout

    model_dir = tmp_path / "fitted"
    fit = _invoke("fit", corpus, "-o", model_dir, "--model", working_tiny_bert, "--calibrator", "whitening", "-q")
    assert fit.exit_code == 0, fit.output
    r = _invoke("evaluate", "--model-dir", model_dir, "--tasks", "STS-B", "--data-dir", layout, "--no-cache")
    assert r.exit_code == 0, r.output
    assert "unknown: fitted beforehand on" in r.stdout and "| mean | whitening |" in r.stdout

    r = _invoke("evaluate", "--model", working_tiny_bert, "--calibrator", "whitening", "--regime", "corpus",
                "--data-dir", layout)  # fmt: skip
    assert r.exit_code == 2 and "--corpus" in r.stderr


def test_cli_reproduce_per_set_with_lodo(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "per-set"
    r = _invoke(
        "reproduce", "--model", working_tiny_bert, "--poolings", "mean", "--calibrators", "none,standard-norm",
        "--regimes", "per-set", "--fit-sizes", "30", "--select", "lodo", "--data-dir", layout, "--no-cache",
        "-o", out, "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "reproduce.json").read_text())
    assert data["meta"]["fit_sizes"] == ["all", "30"] and len(data["sets"]) == 9
    assert [x["fit_size"] for x in data["lodo"]] == [None, 30]
    md = (out / "reproduce.md").read_text()
    assert md == r.stdout and "--regimes per-set --fit-sizes 30 --select lodo" in md
    assert "## Leave-one-dataset-out selection, fit all" in md and "| **all held out** |" in md

    ev = _invoke(
        "evaluate", "--model", working_tiny_bert, "--calibrator", "standard-norm", "--regime", "per-set",
        "--tasks", "STS-B,STS12", "--data-dir", layout, "--no-cache", "-o", tmp_path / "ev", "-q",
    )  # fmt: skip
    assert ev.exit_code == 0, ev.output
    data = json.loads((tmp_path / "ev" / "evaluate.json").read_text())
    assert "--regime per-set" in data["meta"]["command"]  # the report's command re-runs the same protocol
    cells = data["cells"]
    assert [(c["calibrator"], sorted(c["sets"])) for c in cells] == [
        ("none", ["STS-B", "STS12/MSRpar", "STS12/OnWN"]),
        ("standard-norm", ["STS-B", "STS12/MSRpar", "STS12/OnWN"]),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "--fit-sizes", "100"], "--fit-sizes belongs to the per-set regime"),
        (["reproduce", "--regimes", "per-set", "--fit-sizes", "1e3"], "whole numbers"),
        (["reproduce", "--regimes", "per-set", "--fit-sizes", "1"], "at least 2"),
        (["reproduce", "--regimes", "per-set", "--fit-sizes", ","], "at least 2"),
        (["reproduce", "--regimes", "corpus"], "the corpus regime needs a corpus file"),
        (["reproduce", "--select", "lodo"], "--select lodo goes with --regimes per-set"),
        (["reproduce", "--regimes", "per-set", "--select", "best"], "'best' is not one of 'lodo'"),
        (["reproduce", "--regimes", "per-set,target"], "runs alone"),
        (["evaluate", "--regime", "per-set", "--corpus", "CORPUS"], "--corpus has no role"),
    ],
)
def test_cli_per_set_refuses_bad_options(
    args: list[str],
    message: str,
    working_tiny_bert: Path,
    layout: Path,
    tmp_path: Path,  # noqa: F811
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A sentence.\n", encoding="utf-8")
    full = [corpus if a == "CORPUS" else a for a in args]
    r = _invoke(*full, "--model", working_tiny_bert, "--data-dir", layout, "--no-cache", "-o", tmp_path / "o", "-q")
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "o" / "reproduce.json").exists()


def test_find_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(env_dir))
    assert find_data_dir(explicit) == explicit.resolve()
    assert find_data_dir(None) == env_dir.resolve()

    monkeypatch.delenv(DATA_DIR_ENV)
    home = tmp_path / "home"
    (home / ".cache/bertflow/sts").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "repo" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert find_data_dir(None) == (home / ".cache/bertflow/sts").resolve()
    (tmp_path / "repo" / "shared/data/sts").mkdir(parents=True)
    assert find_data_dir(None) == (tmp_path / "repo/shared/data/sts").resolve()
    (work / "shared/data/sts").mkdir(parents=True)
    found = find_data_dir(None)
    assert found == (work / "shared/data/sts").resolve() and found.is_absolute()


def test_find_data_dir_missing_explains_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataNotFoundError) as info:
        find_data_dir(None)
    message = str(info.value)
    for hint in ("--data-dir", DATA_DIR_ENV, "bertflow download-sts", "download_sts()"):
        assert hint in message
    with pytest.raises(DataNotFoundError, match="does not exist"):
        find_data_dir(tmp_path / "nope")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(DataNotFoundError, match=DATA_DIR_ENV):
        find_data_dir(None)
    assert isinstance(info.value, FileNotFoundError)


def test_the_option_help_lists_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bertflow.cli import app

    out = CliRunner().invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"}).output
    flat = " ".join(out.replace("│", " ").split())
    assert DATA_DIR_ENV in flat and all(c in flat for c in DATA_DIR_CANDIDATES)


def test_command_echoes_leave_out_exactly_the_signature_defaults() -> None:
    import inspect

    from bertflow.cli.evaluate import analyze, echo_command, evaluate, reproduce

    for command in (evaluate, reproduce, analyze):
        o = {name: p.default for name, p in inspect.signature(command).parameters.items()}
        assert echo_command(command, o) == f"bertflow {command.__name__}"  # every option at its default
        changed = {**o, "model": "m", "epochs": 2.0, "max_length": 128, "column": ["a", "b"], "device": "cpu"}
        line = echo_command(command, changed)  # in the signature's order; how the run is done is left out
        assert line == f"bertflow {command.__name__} --model m --column a --column b --epochs 2.0 --max-length 128"
    o = {name: p.default for name, p in inspect.signature(analyze).parameters.items()}
    assert echo_command(analyze, {**o, "plots": False, "seed": 3}) == "bertflow analyze --seed 3 --no-plots"
