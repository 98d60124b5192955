"""The options the commands share and their checks (``bertflow.cli.options``): ``-q`` on every command and
``--threads`` on every one that encodes; the first status line before the model loads; bad bytes on the command line
and options a model folder fixes refused in one line before any work; the helpers that read corpora, name columns,
apply ``--weighting`` and print a fit's summary."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from bertflow.cli import app
from bertflow.cli.options import (
    check_devices,
    check_input_file,
    check_text_arguments,
    column_key,
    fit_summary,
    model_label,
    progress_log,
    read_corpus,
    weighted_pooling,
)
from bertflow.errors import InputError

from ..conftest import invoke, one_line_error


@pytest.mark.parametrize("command", ["similarity", "encode"])
def test_the_first_status_line_comes_before_the_model_loads(command, tiny_model_dir, tmp_path, monkeypatch):
    """Item 10: ``bertflow: loading MODEL ...`` on a terminal's stderr before torch and the weights load (16 s of
    silence before); none with -q, none on a pipe (stderr keeps its one-line error)."""
    from bertflow.cli import encode, options, similarity

    def loader(*args, **kwargs):
        raise InputError("the loader ran")

    monkeypatch.setattr({"similarity": similarity, "encode": encode}[command], "build_encoder", loader)
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: True)
    text = tmp_path / "in.txt"
    text.write_text("A man plays a guitar.\n")
    args = {
        "similarity": ["similarity", "One sentence.", "Another one.", "-m", tiny_model_dir],
        "encode": ["encode", text, "-o", tmp_path / "out.npy", "-m", tiny_model_dir],
    }[command]
    lines = invoke(*args).stderr.splitlines()
    assert lines == [f"bertflow: loading {tiny_model_dir} ...", "bertflow: error: the loader ran"]
    assert invoke(*args, "-q").stderr.splitlines() == ["bertflow: error: the loader ran"]
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: False)
    assert invoke(*args).stderr.splitlines() == ["bertflow: error: the loader ran"]


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


def test_invalid_utf8_on_the_command_line(tiny_model_dir, no_model_loading):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 argument
    one_line_error(invoke("similarity", bad, "fine", "--model", tiny_model_dir), "not valid UTF-8", "0xe9")
    one_line_error(invoke("search", "query", tiny_model_dir, bad), "query 1", "not valid UTF-8")


@pytest.mark.parametrize(
    "argv",
    [
        ["encode", "IN", "-o", "OUT.npy", "--pooling", "cls"],
        ["encode", "IN", "-o", "OUT.npy", "--max-length", "32"],
        ["similarity", "a b", "c d", "--model", "other"],
        ["evaluate", "--calibrator", "whitening"],
        ["analyze", "--pooling", "cls", "-o", "OUT"],
    ],
    ids=["encode-pooling", "encode-max-length", "similarity-model", "evaluate-calibrator", "analyze-pooling"],
)
def test_options_a_model_folder_fixes_are_refused_with_model_dir(argv, tmp_path, no_model_loading):
    """--pooling, --max-length, --model (and the fitting options) would be silently ignored with --model-dir."""
    corpus = tmp_path / "in.txt"
    corpus.write_text("a sentence\n", encoding="utf-8")
    argv = [str(corpus) if a == "IN" else str(tmp_path / a) if a.startswith("OUT") else a for a in argv]
    one_line_error(invoke(*argv, "--model-dir", tmp_path / "some-model"), "cannot be combined with --model-dir")
    assert not (tmp_path / "OUT.npy").exists()


def test_column_key_reads_only_ascii_digits_as_an_index():
    assert column_key("0") == 0 and column_key("12") == 12
    assert column_key("sentence1") == "sentence1"
    assert column_key("\u00b2") == "\u00b2"  # superscript two: a digit to str.isdigit, not to int()
    assert column_key("\u0661") == "\u0661"  # Arabic-Indic one: int() would read it, but it is no ASCII digit


def test_weighted_pooling_applies_the_weighting_once():
    assert weighted_pooling("mean", None) == "mean"
    assert weighted_pooling("first-last-avg", "sif") == "sif:first-last-avg"
    assert weighted_pooling("mean", "IDF") == "idf:mean"
    assert weighted_pooling("mean", "none") == "mean"
    with pytest.raises(InputError, match="give the weighting once"):
        weighted_pooling("sif:mean", "idf")
    with pytest.raises(InputError, match="unknown weighting 'tfidf'"):
        weighted_pooling("mean", "tfidf")


def test_check_input_file_takes_standard_input_and_files_only(tmp_path):
    assert check_input_file(None) is None
    assert check_input_file(Path("-")) == Path("-")
    text = tmp_path / "in.txt"
    text.write_text("a sentence\n", encoding="utf-8")
    assert check_input_file(text) == text
    with pytest.raises(InputError, match="missing.txt: no such file"):
        check_input_file(tmp_path / "missing.txt")
    with pytest.raises(InputError, match="it is a folder"):
        check_input_file(tmp_path)


def test_check_text_arguments_names_the_argument_and_the_byte():
    check_text_arguments(["fine", "caf\u00e9", "\u4e2d\u6587"])
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 argument
    with pytest.raises(InputError, match="query 2 on the command line is not valid UTF-8 .byte 0xe9 at character 4"):
        check_text_arguments(["ok", bad], what="query")


def test_fit_summary_is_one_json_line_with_a_flows_last_bits_per_dimension():
    class Flow:
        history_ = {"train_bpd": [3.5, 2.123456]}

        def __repr__(self) -> str:
            return "Flow()"

    line = fit_summary(Path("out"), 10, Flow(), 1.5, shards=2)
    assert "\n" not in line
    assert json.loads(line) == {
        "output": "out",
        "sentences": 10,
        "calibrator": "Flow()",
        "shards": 2,
        "seconds": 1.5,
        "final_train_bpd": 2.1235,
    }
    assert "final_train_bpd" not in json.loads(fit_summary("out", 10, object(), 1.0))  # no history: no line for it


def test_progress_log_shows_a_loggers_info_lines_for_its_block_only(capsys):
    name = "bertflow.tests.progress"
    logger = logging.getLogger(name)
    before = (logger.level, logger.propagate, list(logger.handlers))
    with progress_log(name, quiet=False):
        logger.info("archive 1 of 2")
        logger.debug("not progress")
    logger.info("after the block")
    assert capsys.readouterr().err == "archive 1 of 2\n"  # the message only, on stderr
    with progress_log(name, quiet=True):
        logger.info("quiet")
    assert capsys.readouterr().err == ""
    assert (logger.level, logger.propagate, list(logger.handlers)) == before


def test_model_label_names_what_will_load():
    assert model_label(["a", "b"], "ignored") == "a, b"
    assert model_label([], "my-encoder") == "my-encoder"
    assert "all-MiniLM-L6-v2" in model_label([], None)


def test_read_corpus_reads_lines_or_table_columns(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("one\ntwo\n\none\n", encoding="utf-8")
    assert read_corpus(lines, None, "strict", unique=False) == ["one", "two", "one"]  # the blank line skipped
    assert read_corpus(lines, None, "strict", unique=True) == ["one", "two"]
    table = tmp_path / "pairs.tsv"
    table.write_text("score\tsentence1\tsentence2\n1\ta\tb\n2\tc\ta\n", encoding="utf-8")
    assert read_corpus(table, ["sentence1", "sentence2"], "strict", unique=False) == ["a", "c", "b", "a"]
    assert read_corpus(table, ["1", "sentence2"], "strict", unique=True) == ["a", "c", "b"]  # "1": an index
    table.write_text("score\tsentence1\n1\t \n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2, column 'sentence1' is empty"):
        read_corpus(table, ["sentence1"], "strict", unique=False)


def test_check_devices_refuses_an_unknown_device_before_any_rank_starts():
    assert check_devices(None) is None
    assert check_devices("cpu, cpu") == "cpu, cpu"
    with pytest.raises(InputError, match="tpu"):
        check_devices("cpu,tpu:0")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="cuda"):
            check_devices("cuda:0")
