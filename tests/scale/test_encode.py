"""Encoding to a store as one rank (bertflow.scale.encode; no launcher, no process group): encoding, resuming, and the
distributed commands run as one rank. Fitting as one rank: test_fit.py; the topology: test_launch.py."""

from __future__ import annotations

from unittest.mock import ANY

import numpy as np
import pytest

from bertflow import Embedder, WhiteningCalibrator
from bertflow.embedder import iter_calibrated
from bertflow.errors import InputError, OutputError
from bertflow.scale.encode import encode_file_to_store
from bertflow.scale.layout import read_manifest
from bertflow.scale.reader import open_embeddings

from .conftest import one_thread, reference

ENCODE = dict(shard_size=32, chunk_size=16, batch_size=8)


def test_one_rank_store_is_bitwise_iter_encode(tiny_encoder, corpus_file, tmp_path):
    path, lines = corpus_file
    with one_thread():
        summary = encode_file_to_store(path, tmp_path / "out", tiny_encoder, merge=True, **ENCODE)
    assert summary["rows"] == 203 and summary["shards"] == 7 and summary["encoded_shards"] == 7
    expected = reference(tiny_encoder, lines, batch_size=8, chunk_size=16)
    store = open_embeddings(tmp_path / "out", verify=True)
    np.testing.assert_array_equal(np.asarray(store), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "embeddings.npy"), expected)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["complete"] and manifest["encoder"] == tiny_encoder.get_config()
    assert manifest["input"]["lines"] == 203 and manifest["compute_dtype"] == "float32"
    assert manifest["calibrator"] is None and manifest["bertflow_version"]


def test_resume_redoes_only_missing_shards(tiny_encoder, corpus_file, tmp_path):
    path, lines = corpus_file
    out = tmp_path / "out"
    with one_thread():
        encode_file_to_store(path, out, tiny_encoder, **ENCODE)
        (out / "shards" / "part-000002.npy").unlink()  # lost shard
        (out / "shards" / "part-000005.json").unlink()  # shard written, record never made
        (out / "shards" / ".part-000006.npy.tmp-host-1").write_bytes(b"half a shard")  # a killed writer's file
        summary = encode_file_to_store(path, out, tiny_encoder, **ENCODE)
    assert (summary["encoded_shards"], summary["skipped_shards"]) == (2, 5)
    assert not [p for p in (out / "shards").iterdir() if ".tmp-" in p.name]
    np.testing.assert_array_equal(np.asarray(open_embeddings(out)), reference(tiny_encoder, lines, **_sizes()))
    assert len(read_manifest(out)["runs"]) == 2


def _sizes() -> dict[str, int]:
    return {"batch_size": ENCODE["batch_size"], "chunk_size": ENCODE["chunk_size"]}


def test_resume_refuses_other_settings_unless_overwriting(tiny_encoder, other_tiny_model_dir, corpus_file, tmp_path):
    from bertflow import SentenceEncoder

    path, _ = corpus_file
    out = tmp_path / "out"
    encode_file_to_store(path, out, tiny_encoder, **ENCODE)
    with pytest.raises(InputError, match=r"\(batch_size differ\)"):
        encode_file_to_store(path, out, tiny_encoder, **{**ENCODE, "batch_size": 4})
    other = SentenceEncoder(str(other_tiny_model_dir), device="cpu")
    with pytest.raises(InputError, match=r"\(encoder differ\)"):
        encode_file_to_store(path, out, other, **ENCODE)
    path.write_text("a different corpus\nof two lines\n", encoding="utf-8")
    with pytest.raises(InputError, match="input"):
        encode_file_to_store(path, out, tiny_encoder, **ENCODE)
    summary = encode_file_to_store(path, out, tiny_encoder, overwrite=True, **ENCODE)
    assert summary["rows"] == 2 and summary["skipped_shards"] == 0


def test_bad_options_and_folders_are_refused(tiny_encoder, corpus_file, tmp_path):
    path, _ = corpus_file
    with pytest.raises(InputError, match="multiple of chunk_size"):
        encode_file_to_store(path, tmp_path / "a", tiny_encoder, shard_size=40, chunk_size=16)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("precious")
    with pytest.raises(OutputError, match=r"not empty and holds other files \(thesis.tex\)"):
        encode_file_to_store(path, tmp_path / "busy", tiny_encoder, **ENCODE)
    blank = tmp_path / "blank.txt"
    blank.write_text("one\n\nthree\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2 is empty"):
        encode_file_to_store(blank, tmp_path / "b", tiny_encoder, **ENCODE)


def test_a_calibrated_store_holds_the_calibrated_vectors(tiny_encoder, corpus_file, tmp_path):
    path, lines = corpus_file
    embedder = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(lines)
    with one_thread():
        encode_file_to_store(path, tmp_path / "out", tiny_encoder, calibrator=embedder.calibrator, **ENCODE)
    # The store holds what the one encode-then-calibrate loop gives (calibrated on the device, in float32), bit for
    # bit, and that agrees with the host's float64 transform of the raw vectors to float32 rounding.
    with one_thread():
        expected = np.concatenate(list(iter_calibrated(tiny_encoder, embedder.calibrator, lines, **_sizes())))
    store = open_embeddings(tmp_path / "out")
    assert store.shape == (203, 8)
    np.testing.assert_array_equal(np.asarray(store), expected)
    host = embedder.calibrator.transform(reference(tiny_encoder, lines, **_sizes()))
    np.testing.assert_allclose(np.asarray(store), host, rtol=1e-4, atol=1e-4 * np.abs(host).max())
    # The same record as a search index keeps of the model (Embedder.identity), from the one recipe.
    assert store.manifest["calibrator"] == embedder.identity()["calibrator"]
    assert store.manifest["calibrator"] == {"type": "whitening", "fingerprint": ANY, "dim": 8}


def test_a_calibrated_store_resumes_after_an_upgrade_but_not_with_another_calibrator(
    tiny_encoder, corpus_file, tmp_path, monkeypatch
):
    """The store records the calibrator by a fingerprint without the library version: a run killed under one
    bertflow release is resumed by the next (it used to be refused, 'calibrator differ'); another fit is not."""
    import bertflow._version
    import bertflow.calibrators.base
    import bertflow.scale.encode
    import bertflow.scale.layout

    path, lines = corpus_file
    out = tmp_path / "out"
    calibrator = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(lines).calibrator
    with one_thread():
        encode_file_to_store(path, out, tiny_encoder, calibrator=calibrator, **ENCODE)
    (out / "shards" / "part-000002.npy").unlink()  # the shard a killed run did not finish
    for module in (bertflow._version, bertflow.calibrators.base, bertflow.scale.encode, bertflow.scale.layout):
        monkeypatch.setattr(module, "__version__", "99.0.0")
    with one_thread():
        summary = encode_file_to_store(path, out, tiny_encoder, calibrator=calibrator, **ENCODE)
    assert (summary["encoded_shards"], summary["skipped_shards"]) == (1, 6)
    with one_thread():
        expected = np.concatenate(list(iter_calibrated(tiny_encoder, calibrator, lines, **_sizes())))
    np.testing.assert_array_equal(np.asarray(open_embeddings(out, verify=True)), expected)
    other = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(lines[:100]).calibrator  # same type and dimension
    with pytest.raises(InputError, match=r"\(calibrator differ\)"):
        encode_file_to_store(path, out, tiny_encoder, calibrator=other, **ENCODE)


# -- the commands, as one rank --------------------------------------------------------------------------------------


def test_a_text_file_can_be_stored_as_parquet_shards(tiny_encoder, corpus_file, tmp_path):
    pytest.importorskip("pyarrow")
    path, text_lines = corpus_file
    with one_thread():
        encode_file_to_store(path, tmp_path / "out", tiny_encoder, shard_format="parquet", merge=True, **ENCODE)
    want = reference(tiny_encoder, text_lines, batch_size=8, chunk_size=16)
    np.testing.assert_array_equal(np.asarray(open_embeddings(tmp_path / "out")), want)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "embeddings.npy"), want)
    assert read_manifest(tmp_path / "out")["input"]["lines"] == 203
