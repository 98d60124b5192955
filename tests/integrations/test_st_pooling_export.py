"""Layer-average and frequency-weighted poolings exported with sentence-transformers' own modules
(WeightedLayerPooling, WordWeights, Pooling): the saved folder reloads with plain SentenceTransformer(path) in a
process where bertflow cannot be imported, and gives the Embedder's vectors. (The tiny BERT's vocab.txt lists
"a" twice, so one id is unreachable: the export keeps it under a placeholder string.)"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from bertflow import Embedder, FlowCalibrator, SentenceEncoder  # noqa: E402
from bertflow.calibrators import IdentityCalibrator  # noqa: E402
from bertflow.integrations.sentence_transformers import from_embedder  # noqa: E402

from .test_sentence_transformers import _PLAIN_LOAD, CORPUS  # noqa: E402

POOLINGS = ["first-last-avg", "last2avg", [0, 2], "cls", "sif:first-last-avg", "idf:mean", "sif-3e-4:1,-1"]


def test_poolings_export_with_sentence_transformers_modules_and_reload_without_bertflow(tiny_model_dir, tmp_path):
    args = []
    for n, pooling in enumerate(POOLINGS):
        encoder = SentenceEncoder(str(tiny_model_dir), pooling=pooling, device="cpu")
        # The identity calibrator (a Dense identity in the export): the pooling's own numbers, not a whitening's
        # amplification of the two libraries' rounding in near-empty directions of this tiny model.
        embedder = Embedder(encoder, IdentityCalibrator()).fit(CORPUS)
        model = from_embedder(embedder)
        names = [type(m).__name__ for m in model]
        assert names[-1] == "Dense" and names[-2] == "Pooling", names
        assert ("WeightedLayerPooling" in names) == (encoder.pooling.layers != (encoder.num_layers,))
        assert ("WordWeights" in names) == encoder.pooling.weighting.weighted
        expected = embedder.encode(CORPUS[:10])
        np.testing.assert_allclose(model.encode(CORPUS[:10]), expected, atol=1e-4, err_msg=str(pooling))
        folder = tmp_path / f"st{n}"
        model.save(str(folder))
        assert not list(folder.rglob("*.py"))
        np.save(tmp_path / f"expected{n}.npy", expected)
        load = f"from sentence_transformers import SentenceTransformer\nmodel = SentenceTransformer({str(folder)!r})"
        args += [load, str(tmp_path / f"expected{n}.npy")]
    code = f"SENTENCES = {CORPUS[:10]!r}\n{_PLAIN_LOAD}"
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-I", "-c", code, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    worst = float(done.stdout.split()[-1])
    print(f"max abs diff over {len(POOLINGS)} poolings, reloaded without bertflow: {worst:.2e}")
    assert worst <= 1e-4


def test_a_calibration_module_accepts_the_exported_layer_pooling(tiny_model_dir):
    """The Calibration module's check reads the exported pooling back as bertflow's (first-last-avg), so a
    non-affine calibrator fitted on it is accepted, and computes the Embedder's vectors."""
    encoder = SentenceEncoder(str(tiny_model_dir), pooling="first-last-avg", device="cpu")
    embedder = Embedder(encoder, FlowCalibrator(max_steps=10)).fit(CORPUS)
    model = from_embedder(embedder)
    assert [type(m).__name__ for m in model][-1] == "Calibration"
    np.testing.assert_allclose(model.encode(CORPUS[:10]), embedder.encode(CORPUS[:10]), atol=1e-4)
