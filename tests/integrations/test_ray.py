"""The map step in a real Ray Data pipeline on a local Ray cluster the test starts (issue 25 item 2).

``read_parquet -> map_batches(MapEncoder, ...) -> write_parquet``, read back and compared with ``Embedder.encode``
row by row, matched by the id column (Ray does not promise output order by default).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

import bertflow  # noqa: E402
from bertflow import Embedder, WhiteningCalibrator  # noqa: E402
from bertflow.integrations.map_step import MapEncoder  # noqa: E402

from ..scale.conftest import make_lines, one_thread  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = 60


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 2 CPUs, started for this module and shut down after it."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        # The workers import the bertflow under test (not another install), with one BLAS thread each.
        runtime_env={
            "env_vars": {
                "PYTHONPATH": str(Path(bertflow.__file__).resolve().parents[1]),
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        },
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_data_map_batches_equals_embedder_encode(local_ray, tiny_encoder, tmp_path):
    lines = make_lines(ROWS, seed=5)
    with one_thread():
        embedder = Embedder(tiny_encoder, WhiteningCalibrator(8)).fit(lines)
    embedder.save(tmp_path / "model")
    source = tmp_path / "docs"
    source.mkdir()
    table = pa.table({"doc_id": pa.array(range(ROWS), pa.int64()), "body": lines})
    pq.write_table(table.slice(0, 35), source / "part-0.parquet")
    pq.write_table(table.slice(35), source / "part-1.parquet")

    ds = ray.data.read_parquet(str(source))
    emb = ds.map_batches(
        MapEncoder,
        fn_constructor_kwargs={"model_dir": str(tmp_path / "model"), "text_column": "body", "device": "cpu"},
        batch_format="pyarrow",
        batch_size=16,
        concurrency=1,
        num_cpus=1,
    )
    emb.write_parquet(str(tmp_path / "emb-ray"))

    written = pq.read_table(tmp_path / "emb-ray").sort_by("doc_id")
    assert written.column("doc_id").to_pylist() == list(range(ROWS))
    assert written.column("body").to_pylist() == lines
    got = np.stack(written.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    with one_thread():
        want = embedder.encode(lines)
    assert got.shape == want.shape == (ROWS, 8)
    # Ray batches rows differently from one call over all of them (other padding): float32 rounding, row by row.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
