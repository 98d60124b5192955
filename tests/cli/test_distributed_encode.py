"""`bertflow distributed-encode` end to end: checks before any rank starts, one store per run."""

from __future__ import annotations

import os
import socket

from bertflow.io.files import folder_lock

from ..conftest import SENTENCES, invoke, one_line_error
from ..safety import dead_pid, encode_store_args


def test_distributed_encode_refuses_a_weighted_raw_encoder_before_any_rank(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from bertflow.cli import app

    text = tmp_path / "in.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        app,
        [
            "distributed-encode",
            str(text),
            "-o",
            str(tmp_path / "store"),
            "-m",
            str(tiny_model_dir),
            "--pooling",
            "sif:mean",
        ],
    )
    assert result.exit_code == 2 and "needs token statistics" in result.output
    assert not (tmp_path / "store").exists()


def test_a_store_encoded_before_the_tokenizer_fingerprint_still_resumes(tiny_model_dir, corpus, tmp_path):
    import json

    from bertflow.scale.layout import MANIFEST_NAME

    store = tmp_path / "emb"
    args = ["distributed-encode", corpus, "-o", store, "--model", tiny_model_dir, "-q", "--chunk-size", "16"]
    args += ["--shard-size", "32"]
    assert invoke(*args).exit_code == 0
    manifest = json.loads((store / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert manifest["encoder"].pop("tokenizer_fingerprint").startswith("t1-")
    (store / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    r = invoke(*args)  # the earlier record lacks the key: resumed, not "encoder differs"
    assert r.exit_code == 0, r.stderr
    manifest["encoder"]["tokenizer_fingerprint"] = "t1-0000000000000000"
    (store / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    one_line_error(invoke(*args), "encoder")  # a recorded, different tokenizer is another encoder


def test_two_distributed_encode_runs_on_one_store(tiny_model_dir, corpus, tmp_path):
    store = tmp_path / "emb"
    store.mkdir()
    args = encode_store_args(corpus, store, tiny_model_dir)
    with folder_lock(store, "distributed-encode run"):  # another run, alive, holds the store
        one_line_error(invoke(*args), "in use", str(os.getpid()))
    (store / ".lock").write_text(f"{socket.gethostname()}-{dead_pid()}\n")  # left by a killed run
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert not (store / ".lock").exists()


def test_devices_are_checked_before_the_ranks_start(tiny_model_dir, corpus, tmp_path):
    one_line_error(invoke("distributed-encode", corpus, "-o", tmp_path / "e", "--device", "bogus"), "unknown device")
    one_line_error(
        invoke("distributed-encode", corpus, "-o", tmp_path / "e", "--devices", "cpu,nope"), "unknown device"
    )
