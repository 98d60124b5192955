"""MapEncoder (integrations/map_step.py) in a process pool: the same vectors as Embedder.encode; it pickles without
its model and names bad batches. (Under Ray Data: test_ray.py.)"""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from bertflow import Embedder, WhiteningCalibrator  # noqa: E402
from bertflow.errors import InputError  # noqa: E402
from bertflow.integrations.map_step import MapEncoder  # noqa: E402

from ..io.test_arrow import ROWS, _table, lines  # noqa: E402, F401 - lines: the fixture
from ..scale.conftest import one_thread  # noqa: E402


def _start_worker(kwargs: dict) -> None:
    """Pool initializer: what Ray does with fn_constructor_kwargs, one MapEncoder per worker process."""
    global _worker
    import torch

    torch.set_num_threads(1)
    _worker = MapEncoder(**kwargs)


def _map(batch):
    return _worker(batch)


def test_map_encoder_in_a_process_pool_equals_embedder_encode(tiny_encoder, tmp_path, lines):  # noqa: F811
    with one_thread():
        embedder = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(lines)
    embedder.save(tmp_path / "model")
    table = _table(lines)
    batches = [table.slice(a, 25) for a in range(0, ROWS, 25)]  # Ray's batch_format="pyarrow"
    as_dicts = [
        {"text": np.array(b.column("text").to_pylist()), "doc_id": b.column("doc_id").to_numpy()} for b in batches
    ]
    context = multiprocessing.get_context("spawn")
    with context.Pool(
        2, initializer=_start_worker, initargs=({"model_dir": str(tmp_path / "model"), "device": "cpu"},)
    ) as pool:
        tables = pool.map(_map, batches)
        dicts = pool.map(_map, as_dicts)
    with one_thread():
        per_batch = [embedder.encode(b.column("text").to_pylist()) for b in batches]
        whole = embedder.encode(lines)
    for got, got_dict, want, batch in zip(tables, dicts, per_batch, batches, strict=True):
        assert got.column_names == ["doc_id", "text", "embedding"] and got.column("doc_id") == batch.column("doc_id")
        assert got.schema.field("embedding").type == pa.list_(pa.float32(), 8)
        np.testing.assert_array_equal(np.stack(got.column("embedding").to_numpy(zero_copy_only=False)), want)
        np.testing.assert_array_equal(got_dict["embedding"], want)
    # Batching (padding) differs from one call on all rows: equal to float32 rounding, not bit for bit.
    np.testing.assert_allclose(np.concatenate(per_batch), whole, rtol=1e-4, atol=1e-4)


def test_map_encoder_pickles_without_its_model_and_names_bad_batches(tiny_model_dir, tiny_encoder, lines):  # noqa: F811
    enc = MapEncoder(model=str(tiny_model_dir), device="cpu", fixed_size=False)
    batch = pa.record_batch([pa.array(lines[:5])], names=["text"])
    with one_thread():
        first = enc(batch)
        want = tiny_encoder.encode(lines[:5])
    assert first.schema.field("embedding").type == pa.list_(pa.float32())  # what Spark's mapInArrow reads
    np.testing.assert_array_equal(np.stack(first.column("embedding").to_numpy(zero_copy_only=False)), want)
    shipped = pickle.loads(pickle.dumps(enc))
    assert shipped._encode is None and len(pickle.dumps(enc)) < 2000
    with one_thread():
        again = list(shipped.map_batches([batch]))
    assert again[0].equals(first)
    with pytest.raises(InputError, match="has no column 'text'; its columns: body"):
        enc(pa.table({"body": lines[:2]}))
    with pytest.raises(InputError, match="is empty or only whitespace"):
        enc({"text": np.array(["fine", "  "])})
    with pytest.raises(InputError, match="exactly one"):
        MapEncoder()
