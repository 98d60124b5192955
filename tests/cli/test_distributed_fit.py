"""`bertflow distributed-fit` end to end: what it refuses to write over."""

from __future__ import annotations

import pytest

from ..conftest import CORPUS, invoke, one_line_error, snapshot
from ..safety import encode_store_args


@pytest.fixture()
def corpus(tmp_path):
    """The corpus in a folder of its own, ``tmp_path / "data"``: ``-o`` that folder is "not empty", not "holds the
    input" (the store is elsewhere in ``tmp_path``)."""
    path = tmp_path / "data" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


def test_distributed_fit_refuses_the_store_and_foreign_folders(tiny_model_dir, corpus, tmp_path):
    store = tmp_path / "emb"
    r = invoke(*encode_store_args(corpus, store, tiny_model_dir))
    assert r.exit_code == 0, r.output
    before = snapshot(store)
    one_line_error(
        invoke("distributed-fit", store, "-o", store, "--calibrator", "whitening", "-q", "--overwrite"),
        "holds the input",
    )
    one_line_error(
        invoke("distributed-fit", store, "-o", corpus.parent, "--calibrator", "whitening", "-q"), "not empty"
    )
    assert snapshot(store) == before
    out = tmp_path / "white"
    assert invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q").exit_code == 0
    one_line_error(invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q"), "--overwrite")
    assert invoke("distributed-fit", store, "-o", out, "--calibrator", "whitening", "-q", "--overwrite").exit_code == 0
    # distributed-encode into a model folder: not a store, refused even with --overwrite.
    one_line_error(
        invoke("distributed-encode", corpus, "-o", out, "--model", tiny_model_dir, "--overwrite"), "bertflow model"
    )
