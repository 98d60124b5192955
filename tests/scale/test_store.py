"""The embedding store in one process (bertflow.scale.store): ``write_store`` (the ``store`` fixture of conftest.py)
and merging its shards into one array. The layout, the shard writers and the reader have their own files."""

from __future__ import annotations

import hashlib

import numpy as np

from bertflow.scale.layout import read_manifest
from bertflow.scale.store import merge_shards


def test_merge_writes_one_memory_mappable_array(store, matrix):
    path = merge_shards(store.folder)
    merged = np.load(path, mmap_mode="r")
    np.testing.assert_array_equal(merged, matrix)
    record = read_manifest(store.folder)["merged"]
    assert record["file"] == "embeddings.npy"
    # The recorded digest and size are those of the whole file, header included.
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["bytes"] == path.stat().st_size
