"""Rules about outputs that every `bertflow` command follows: a file bertflow did not write is not replaced without
``--overwrite``, and an unwritable destination is one line before any work. (The exit statuses, the closed pipe and
``--version``: tests/cli/test_app.py; the shared options' checks: test_options.py; ``-`` as standard input:
test_fit.py, test_search.py, test_encode.py.)"""

from __future__ import annotations

import numpy as np

from ..conftest import CORPUS, invoke, one_line_error
from ..safety import fit_args


def test_encode_and_similarity_refuse_to_replace_a_file_bertflow_did_not_write(tiny_model_dir, corpus, tmp_path):
    notes = tmp_path / "notes.npy"
    notes.write_text("my notes", encoding="utf-8")
    one_line_error(invoke("encode", corpus, "-o", notes, "--model", tiny_model_dir, "-q"), "--overwrite", "notes.npy")
    assert notes.read_text(encoding="utf-8") == "my notes"
    # A matrix saved by numpy is not bertflow's output either (its header is numpy's 128 bytes, not bertflow's).
    mine = tmp_path / "mine.npy"
    np.save(mine, np.ones((3, 4), dtype=np.float32))
    one_line_error(invoke("encode", corpus, "-o", mine, "--model", tiny_model_dir, "-q"), "--overwrite")
    assert np.array_equal(np.load(mine), np.ones((3, 4), dtype=np.float32))

    out = tmp_path / "vectors.npy"
    assert invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q").exit_code == 0
    first = np.load(out)
    assert first.shape[0] == len(CORPUS)
    assert invoke("encode", corpus, "-o", out, "--model", tiny_model_dir, "-q").exit_code == 0  # its own: replaced
    assert np.array_equal(np.load(out), first)
    assert invoke("encode", corpus, "-o", notes, "--model", tiny_model_dir, "-q", "--overwrite").exit_code == 0
    assert np.array_equal(np.load(notes), first)

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t1\n" for a, b in zip(CORPUS, CORPUS[3:], strict=False))
    )
    diary = tmp_path / "diary.tsv"
    diary.write_text("date\tentry\n2026-01-01\tnew year\n", encoding="utf-8")
    args = ["similarity", "--pairs", pairs, "--model", tiny_model_dir, "-q", "-o"]
    one_line_error(invoke(*args, diary), "--overwrite", "diary.tsv")
    assert diary.read_text(encoding="utf-8") == "date\tentry\n2026-01-01\tnew year\n"
    scores = tmp_path / "scores.tsv"
    assert invoke(*args, scores).exit_code == 0
    assert invoke(*args, scores).exit_code == 0  # its own output: replaced
    assert invoke(*args, diary, "--overwrite").exit_code == 0
    assert diary.read_text(encoding="utf-8") == scores.read_text(encoding="utf-8")


def test_unwritable_destinations_fail_before_any_work(tiny_model_dir, corpus, tmp_path, no_model_loading):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    one_line_error(invoke(*fit_args(corpus, blocker / "model", tiny_model_dir)), "is not a folder")
    one_line_error(invoke(*fit_args(corpus, blocker, tiny_model_dir)), "not a folder")
    one_line_error(
        invoke("encode", corpus, "-o", tmp_path / "missing" / "x.npy", "--model", tiny_model_dir), "does not exist"
    )
    one_line_error(invoke("encode", corpus, "-o", tmp_path, "--model", tiny_model_dir), "is a folder")
    one_line_error(
        invoke("search", "build", corpus, "--model-dir", tmp_path / "m", "-o", blocker / "i"), "is not a folder"
    )
    # Report folders (evaluate, reproduce, analyze) are checked before the evaluation runs.
    one_line_error(invoke("evaluate", "--model", tiny_model_dir, "-o", blocker), "not a folder")
    one_line_error(invoke("reproduce", "--model", tiny_model_dir, "-o", blocker / "r"), "is not a folder")
    one_line_error(invoke("analyze", "--model", tiny_model_dir, "-o", blocker / "r"), "is not a folder")
