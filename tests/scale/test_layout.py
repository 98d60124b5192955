"""Shard layout (bertflow.scale.layout): the shard plan, a shard's completion record, and the manifest's checks."""

from __future__ import annotations

import json

import pytest

from bertflow.errors import InputError, ModelFileError
from bertflow.scale.layout import ShardSpec, plan_shards, shard_record
from bertflow.scale.reader import open_embeddings


def test_plan_cuts_rows_into_shards():
    assert plan_shards(25, 10) == [ShardSpec(0, 0, 10), ShardSpec(1, 10, 20), ShardSpec(2, 20, 25)]
    assert plan_shards(0, 10) == []
    with pytest.raises(InputError):
        plan_shards(5, 0)


def test_a_truncated_or_mismatched_shard_is_not_complete(store):
    spec = store.specs[2]
    assert shard_record(store.folder, spec, 5) is not None
    assert shard_record(store.folder, spec, 6) is None  # another dimension than planned
    path = store.folder / "shards" / spec.name
    path.write_bytes(path.read_bytes()[:-4])
    assert shard_record(store.folder, spec, 5) is None


def test_a_newer_or_foreign_manifest_is_refused(store):
    manifest_path = store.folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(ModelFileError, match="upgrade bertflow"):
        open_embeddings(store.folder)
    manifest_path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ModelFileError, match="not a bertflow embedding-store"):
        open_embeddings(store.folder)
    with pytest.raises(ModelFileError, match="is missing"):
        open_embeddings(store.folder / "nowhere")
