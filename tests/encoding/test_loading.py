"""Loading a checkpoint (encoding/loading.py): the weights fingerprint, missing models, raw MLM checkpoints."""

from __future__ import annotations

from bertflow import SentenceEncoder


def test_the_weights_fingerprint_is_hashed_once_per_process_per_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    """Loading the same checkpoint files again reuses the fingerprint (memo keyed by the files' stat); a changed
    file is hashed again; an encoder built from a model object is always hashed."""
    import os
    import shutil

    from bertflow.encoding import loading

    calls = []
    real = loading._hash_weights
    monkeypatch.setattr(loading, "_hash_weights", lambda *a: calls.append(1) or real(*a))
    folder = shutil.copytree(tiny_model_dir, tmp_path / "enc")
    first = SentenceEncoder(str(folder), device="cpu").fingerprint()
    second = SentenceEncoder(str(folder), device="cpu").fingerprint()
    assert first == second and len(calls) == 1
    config = folder / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # touched: hashed again
    assert SentenceEncoder(str(folder), device="cpu").fingerprint() == first and len(calls) == 2
    built = SentenceEncoder(str(folder), device="cpu")
    in_memory = SentenceEncoder(model=built.model, tokenizer=built.tokenizer, device="cpu")
    assert in_memory.fingerprint() == first and len(calls) == 3
