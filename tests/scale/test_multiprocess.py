"""Two real ranks (gloo, CPU): distributed results equal single-process ones, and a killed job resumes exactly.

Three launches in all, because each costs a few seconds of imports on CI's two cores:

1. a 2-rank job (``launch_local``) fits whitening and two flows on a store, then encodes a file and has rank 1
   SIGKILLed mid-shard;
2. ``torchrun --nproc_per_node=2 -m bertflow distributed-encode`` resumes that store;
3. ``encode_multi_device`` on ``["cpu", "cpu"]``.

Tolerances: whitening 1e-10 (measured ~1e-14); flow latents 1e-4 absolute on values up to ~5.5 (measured
~4e-6: the gradients are summed in another order, and the difference compounds over the ~25 Adam steps), the
loss history 1e-5, and the held-out best step identical. Encodings: bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch.multiprocessing as mp

from bertflow import FlowCalibrator, SentenceEncoder, WhiteningCalibrator
from bertflow.errors import InputError
from bertflow.scale.launch import launch_local
from bertflow.scale.layout import read_manifest
from bertflow.scale.reader import open_embeddings
from bertflow.scale.store import write_store

from . import workers
from .conftest import anisotropic32_rows, make_lines, one_thread, reference

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def job(tiny_model_dir, tmp_path_factory):
    """Run launch 1 once for the module; the tests below read what it left."""
    root = tmp_path_factory.mktemp("two-ranks")
    x = anisotropic32_rows()
    write_store(x, root / "fit", shard_size=128)
    lines = make_lines(250, seed=1)
    (root / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = {
        "out": str(root),
        "fit_store": str(root / "fit"),
        "model": str(tiny_model_dir),
        "input": str(root / "input.txt"),
        "store": str(root / "store"),
    }
    # Either rank can be reported: rank 1's SIGKILL, or rank 0's error when gloo sees its peer vanish.
    with pytest.raises((mp.ProcessExitedException, mp.ProcessRaisedException)):
        launch_local(workers.fit_then_encode_with_a_kill, ["cpu", "cpu"], args)
    return SimpleNamespace(root=root, x=x, lines=lines, model=tiny_model_dir)


def test_whitening_over_two_ranks_equals_one_process(job):
    ref = WhiteningCalibrator().fit(job.x)
    ranks = [np.load(job.root / f"white-{r}.npz") for r in (0, 1)]
    for got in ranks:
        np.testing.assert_allclose(got["mean"], ref.mean_, rtol=0, atol=1e-10)
        np.testing.assert_allclose(got["var"], ref.explained_variance_, rtol=1e-10)
        sign = np.sign((got["components"] * ref.components_).sum(0))  # eigenvectors are defined up to sign
        np.testing.assert_allclose(got["components"] * sign, ref.components_, rtol=0, atol=1e-10)
    assert all(np.array_equal(ranks[0][k], ranks[1][k]) for k in ("mean", "components", "var"))


@pytest.mark.parametrize("name", list(workers.FLOW_CONFIGS))
def test_flow_over_two_ranks_matches_one_process(job, name):
    with one_thread():
        ref = FlowCalibrator(**workers.FLOW_CONFIGS[name]).fit(job.x)
        expected = ref.transform(job.x)
    rank0, rank1 = (np.load(job.root / f"flow-{name}-{r}.npz") for r in (0, 1))
    np.testing.assert_array_equal(rank0["z"], rank1["z"])  # the ranks never drift apart
    assert rank0["passthrough"].tolist() == ref.passthrough_.tolist() == [7]
    assert int(rank0["best_step"]) == ref.best_step_
    np.testing.assert_allclose(rank0["train_bpd"], ref.history_["train_bpd"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rank0["val_bpd"], ref.history_["val_bpd"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rank0["z"], expected, rtol=0, atol=1e-4)


def test_a_killed_rank_leaves_its_finished_shards_and_no_short_one(job):
    store = job.root / "store"
    manifest = read_manifest(store)
    shards = store / "shards"
    done = [e["index"] for e in manifest["shards"] if (shards / f"part-{e['index']:06d}.json").exists()]
    # 250 rows in shards of 32: rank 1 owns shards 4..7, finished 4 and died inside 5.
    assert 4 in done and 5 not in done and not manifest["complete"]
    assert any(p.name.startswith(".part-000005.npy.tmp-") for p in shards.iterdir())
    with pytest.raises(InputError, match="not complete"):
        open_embeddings(store)


def test_torchrun_resumes_the_killed_job_bit_for_bit(job):
    store = job.root / "store"
    before = {p.name for p in (store / "shards").iterdir() if p.suffix == ".json"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bertflow"]
    cmd += ["distributed-encode", str(job.root / "input.txt"), "-o", str(store), "--model", str(job.model)]
    cmd += ["--device", "cpu", "--shard-size", "32", "--chunk-size", "16", "--batch-size", "8", "--merge", "-q"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["skipped_shards"] == len(before) >= 1
    assert summary["encoded_shards"] == 8 - len(before)
    encoder = SentenceEncoder(str(job.model), pooling="mean", device="cpu")
    expected = reference(encoder, job.lines, **{k: workers.ENCODE[k] for k in ("batch_size", "chunk_size")})
    np.testing.assert_array_equal(np.asarray(open_embeddings(store, verify=True)), expected)
    np.testing.assert_array_equal(np.load(store / "embeddings.npy"), expected)
    assert not [p for p in (store / "shards").iterdir() if ".tmp-" in p.name]
    assert read_manifest(store)["complete"]
