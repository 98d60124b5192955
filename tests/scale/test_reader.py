"""The store reader (bertflow.scale.reader): indexing like the matrix, verification, incomplete and foreign stores."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow.errors import InputError, ModelFileError
from bertflow.scale.reader import open_embeddings


def test_the_store_indexes_like_the_matrix(store, matrix):
    assert store.shape == matrix.shape and len(store) == 103 and len(store.specs) == 11
    np.testing.assert_array_equal(np.asarray(store), matrix)
    for key in [0, 57, -1, slice(None), slice(8, 31), slice(95, 200), slice(3, 90, 7), slice(None, None, -3)]:
        np.testing.assert_array_equal(store[key], matrix[key])
    picks = [102, 0, 55, 55, -3, 9, 10]
    np.testing.assert_array_equal(store[picks], matrix[picks])
    np.testing.assert_array_equal(store[np.array(picks)], matrix[picks])
    mask = np.zeros(103, bool)
    mask[[1, 50, 99]] = True
    np.testing.assert_array_equal(store[mask], matrix[mask])
    np.testing.assert_array_equal(store[12:47, 1:3], matrix[12:47, 1:3])
    np.testing.assert_array_equal(store[5, 4], matrix[5, 4])
    np.testing.assert_array_equal(np.concatenate(list(store.iter_chunks(rows=7))), matrix)
    with pytest.raises(IndexError):
        store[103]
    with pytest.raises(IndexError):
        store[[0, 400]]


def test_verify_catches_a_changed_byte(store):
    store.verify()
    path = store.folder / "shards" / store.specs[4].name
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="sha256"):
        open_embeddings(store.folder, verify=True)


def test_an_incomplete_store_is_refused_with_the_missing_shards(store):
    (store.folder / "shards" / store.specs[3].record_name).unlink()
    with pytest.raises(InputError, match=r"1 of 11 shard\(s\) are not complete \(3\); re-run"):
        open_embeddings(store.folder)
