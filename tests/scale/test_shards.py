"""Shard writers (bertflow.scale.shards): a shard exists only once committed; a failed one leaves nothing behind."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow.errors import InputError
from bertflow.scale.layout import ShardSpec, shard_record
from bertflow.scale.shards import ShardWriter, TableShardWriter


def test_a_shard_exists_only_once_committed(tmp_path):
    spec = ShardSpec(3, 30, 36)
    rows = np.arange(18, dtype=np.float32).reshape(6, 3)
    writer = ShardWriter(tmp_path, spec, 3, record={"rank": 1})
    writer.write(rows[:4])
    assert shard_record(tmp_path, spec, 3) is None and not (tmp_path / "shards" / spec.name).exists()
    writer.write(rows[4:])
    record = writer.commit()
    assert record["rank"] == 1 and record["rows"] == 6 and shard_record(tmp_path, spec, 3) == record
    np.testing.assert_array_equal(np.load(tmp_path / "shards" / spec.name), rows)
    assert [p.name for p in (tmp_path / "shards").iterdir() if ".tmp-" in p.name] == []


def test_a_failed_shard_leaves_nothing_behind(tmp_path):
    spec = ShardSpec(0, 0, 4)
    with pytest.raises(RuntimeError, match="encoder broke"), ShardWriter(tmp_path, spec, 2) as writer:
        writer.write(np.zeros((2, 2), np.float32))
        raise RuntimeError("encoder broke")
    assert list((tmp_path / "shards").iterdir()) == []
    with ShardWriter(tmp_path, spec, 2, background=False) as writer:
        with pytest.raises(InputError, match="overflows"):
            writer.write(np.zeros((5, 2), np.float32))
        writer.write(np.zeros((3, 2), np.float32))
        with pytest.raises(InputError, match="got 3 rows, expected 4"):
            writer.commit()


def test_a_failed_table_shard_leaves_nothing_behind(tmp_path):
    pytest.importorskip("pyarrow")  # the table writer needs the optional pyarrow
    spec = ShardSpec(0, 0, 4, suffix=".parquet")
    with pytest.raises(RuntimeError, match="encoder died"):
        with TableShardWriter(tmp_path, spec, 3) as writer:
            writer.write(np.ones((2, 3), np.float32))
            raise RuntimeError("encoder died")
    assert list((tmp_path / "shards").iterdir()) == []
    with pytest.raises(InputError, match="got 2 rows, expected 4"):
        with TableShardWriter(tmp_path, spec, 3, background=False) as writer:
            writer.write(np.ones((2, 3), np.float32))
            writer.commit()
    assert list((tmp_path / "shards").iterdir()) == []
