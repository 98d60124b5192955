"""bertflow.integrations.sentence_transformers: the Calibration module inside sentence-transformers pipelines (save /
load round trip, encoder and dimension checks, pickling) and the guarded loader (code, module list, checksums)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402

from bertflow import (  # noqa: E402
    CompatibilityError,
    Embedder,
    InputError,
    SentenceEncoder,
    WhiteningCalibrator,
)
from bertflow.errors import ModelFileError  # noqa: E402
from bertflow.integrations.sentence_transformers import CHECKSUM_FILE, Calibration, load_calibrated  # noqa: E402
from bertflow.integrations.st_export import fit_calibrator, from_embedder  # noqa: E402

from .conftest import CORPUS, card_load_line, tiny_st  # noqa: E402


def test_save_load_round_trip(base, tmp_path, tiny_model_dir):
    model = fit_calibrator(base, CORPUS, "whitening-8", portable=False)  # the flow's round trip: the slow test below
    model.save(str(tmp_path / "st"))
    folder = tmp_path / "st" / "2_Calibration"
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "fitting.json", "fitted_on.json"}
    assert not list((tmp_path / "st").rglob("*.bin")) and not list((tmp_path / "st").rglob("*.pt"))
    # sentence-transformers >= 6 imports classes outside its namespace only with trust_remote_code=True.
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(tmp_path / "st"), device="cpu")
    loaded = SentenceTransformer(str(tmp_path / "st"), device="cpu", trust_remote_code=True)
    assert isinstance(loaded[2], Calibration) and isinstance(loaded[2].calibrator, WhiteningCalibrator)
    np.testing.assert_array_equal(loaded.encode(CORPUS), model.encode(CORPUS))
    assert loaded[2].fitting == model[2].fitting
    # The base model is a local folder (tmp_path): no absolute path goes into what is saved.
    written = "".join(p.read_text() for p in (tmp_path / "st").rglob("*.json"))
    assert str(tiny_model_dir) not in written and str(tmp_path) not in written
    # The guarded loader: a folder that could run code under trust_remote_code=True is refused before loading.
    np.testing.assert_array_equal(
        load_calibrated(str(tmp_path / "st"), device="cpu").encode(CORPUS[:5]), model.encode(CORPUS[:5])
    )
    config = tmp_path / "st" / "config.json"
    saved = config.read_text()
    config.write_text(saved.replace("{", '{"auto_map": {"AutoModel": "modeling_evil.Evil"}, ', 1))
    with pytest.raises(ModelFileError, match="auto_map"):
        load_calibrated(str(tmp_path / "st"))
    config.write_text(saved)
    (tmp_path / "st" / "2_Calibration" / "modeling_evil.py").write_text("raise SystemExit('ran')\n")
    with pytest.raises(ModelFileError, match="contains code"):
        load_calibrated(str(tmp_path / "st"))
    (tmp_path / "st" / "2_Calibration" / "modeling_evil.py").unlink()
    modules = tmp_path / "st" / "modules.json"
    saved = modules.read_text()
    modules.write_text(saved.replace("sentence_transformers.base.modules.normalize.Normalize", "evil.Module"))
    assert modules.read_text() != saved
    with pytest.raises(ModelFileError, match="'evil.Module'"):
        load_calibrated(str(tmp_path / "st"))
    modules.write_text(saved)
    # The card's usage snippet, as written (the placeholder id aside), loads it; and tells to install bertflow.
    assert 'pip install -U "bertflow[st]"' in (tmp_path / "st" / "README.md").read_text()
    scope: dict = {}
    exec(card_load_line(tmp_path / "st"), scope)
    np.testing.assert_array_equal(scope["model"].encode(CORPUS[:5]), model.encode(CORPUS[:5]))


def test_refuses_another_transformer_or_truncation(base, other_tiny_model_dir, tiny_model_dir):
    model = fit_calibrator(base, CORPUS, "whitening", portable=False)
    module = model[2]
    with pytest.raises(CompatibilityError, match="fingerprint"):
        SentenceTransformer(modules=[*list(tiny_st(other_tiny_model_dir))[:2], module], device="cpu")
    with pytest.raises(CompatibilityError, match="max_seq_length = 64"):
        SentenceTransformer(modules=[*list(tiny_st(tiny_model_dir, max_seq_length=32))[:2], module], device="cpu")
    with pytest.raises(InputError, match="already has a Calibration"):
        fit_calibrator(model, CORPUS)
    with pytest.raises(InputError, match="list of sentences"):
        fit_calibrator(base, "corpus.txt")


def test_forward_keeps_device_and_dtype_and_checks_dimension(base):
    module = fit_calibrator(base, CORPUS, "whitening", portable=False)[2]
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    out = module({"sentence_embedding": x})["sentence_embedding"]
    assert out.dtype == torch.bfloat16 and out.device == x.device and out.shape == (4, module.get_embedding_dimension())
    ref = module.calibrator.transform(x.float().numpy())
    np.testing.assert_allclose(out.float().numpy(), ref, rtol=2e-2, atol=2e-2)  # bf16 output rounding
    with pytest.raises(CompatibilityError, match="16-dimensional"):
        module({"sentence_embedding": torch.randn(2, 16)})
    with pytest.raises(CompatibilityError, match="inference-only"):
        module({"sentence_embedding": torch.randn(2, 32, requires_grad=True)})


def test_embedder_calibrator_works_in_a_sentence_transformer(tiny_model_dir):
    """A calibrator fitted by bertflow's Embedder drops into the same checkpoint's SentenceTransformer pipeline:
    both libraries compute the same encoder fingerprint, and the embeddings agree."""
    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), device="cpu"), WhiteningCalibrator()).fit(CORPUS)
    st = SentenceTransformer(modules=[*list(tiny_st(tiny_model_dir))[:2], Calibration(embedder.calibrator)])
    np.testing.assert_allclose(st.encode(CORPUS[:16]), embedder.encode(CORPUS[:16]), atol=1e-4)


def test_forward_refuses_a_corrupted_calibrator_output(base):
    """A corrupted weight (1e35) would make every similarity 1.000000: refused, as by Embedder.encode."""
    module = fit_calibrator(base, CORPUS, "whitening", portable=False)[2]
    x = torch.randn(4, 32)
    assert torch.isfinite(module({"sentence_embedding": x})["sentence_embedding"]).all()
    module.calibrator.components_[3, 1] = 1e35
    module.__dict__.pop("_transforms", None)  # the torch transform holds a copy of the fitted state
    with pytest.raises(InputError, match="Calibration module's calibrator turned finite embeddings into .* column 1"):
        module({"sentence_embedding": x})


@pytest.mark.parametrize("spec", ["whitening-8", "flow"])
def test_module_pickles_after_encoding(base, spec):
    """sentence-transformers' multi-process encoding pickles the model; the per-device functions Calibration caches
    on its first forward (closures) must not travel, and the copy must encode the same."""
    import pickle

    options = {"max_steps": 5} if spec == "flow" else {"portable": False}
    model = fit_calibrator(base, CORPUS, spec, **options)
    first = model.encode(CORPUS[:6])  # fills the cache
    assert model[2].__dict__.get("_transforms")
    copy = pickle.loads(pickle.dumps(model))
    assert "_transforms" not in copy[2].__dict__
    np.testing.assert_array_equal(copy.encode(CORPUS[:6]), first)
    assert model[2].__dict__.get("_transforms")  # pickling did not empty the original's cache


def test_multi_process_encoding_after_a_first_encode(base):
    """The pool path: encode once in this process, then with two CPU worker processes (device=[...])."""
    model = fit_calibrator(base, CORPUS, "whitening-8", portable=False)
    single = model.encode(CORPUS[:12])
    pooled_out = model.encode(CORPUS[:12], device=["cpu", "cpu"], chunk_size=6)
    np.testing.assert_allclose(pooled_out, single, rtol=1e-5, atol=1e-6)


def test_load_calibrated_refuses_an_edited_module_list(tiny_model_dir, tmp_path, monkeypatch):
    import json
    import shutil

    base = tiny_st(tiny_model_dir, normalize=False)
    saved = tmp_path / "st"
    fit_calibrator(base, CORPUS, "whitening-8", portable=False).save(str(saved))
    expected = load_calibrated(str(saved), device="cpu").encode(CORPUS[:3])
    # The Calibration entry deleted from modules.json: the uncalibrated model would load without a word.
    dropped = tmp_path / "dropped"
    shutil.copytree(saved, dropped)
    modules = json.loads((dropped / "modules.json").read_text())
    (dropped / "modules.json").write_text(json.dumps([m for m in modules if "Calibration" not in m["type"]]))
    with pytest.raises(ModelFileError, match="does not list"):
        load_calibrated(str(dropped), device="cpu")
    # The Calibration folder deleted: a one-line error, not sentence-transformers' traceback.
    missing = tmp_path / "missing"
    shutil.copytree(saved, missing)
    shutil.rmtree(missing / "2_Calibration")
    with pytest.raises(ModelFileError, match="missing"):
        load_calibrated(str(missing), device="cpu")
    # A hub id offline and not cached: one line naming HF_HUB_OFFLINE.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelFileError, match="HF_HUB_OFFLINE"):
        load_calibrated("someone/no-such-calibrated-model")
    np.testing.assert_array_equal(load_calibrated(str(saved), device="cpu").encode(CORPUS[:3]), expected)


def test_load_calibrated_checks_the_checksums_the_export_wrote(tiny_model_dir, tmp_path):
    """The export's save writes the sha256 of every file it wrote; a Dense weight edited x1e30 (which would give
    1e29-sized vectors) is refused with one line naming the file; the clean folder loads, also without bertflow."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), device="cpu"), WhiteningCalibrator(8)).fit(CORPUS)
    saved = tmp_path / "st"
    from_embedder(embedder).save(str(saved))
    listed = json.loads((saved / CHECKSUM_FILE).read_text())["files"]
    (dense,) = [p for p in saved.glob("*_Dense")]
    weights = f"{dense.name}/model.safetensors"
    assert weights in listed and "modules.json" in listed and "model.safetensors" in listed
    clean = load_calibrated(str(saved), device="cpu").encode(CORPUS[:3])
    np.testing.assert_allclose(clean, embedder.encode(CORPUS[:3]), atol=1e-4)
    assert SentenceTransformer(str(saved), device="cpu").encode(CORPUS[:1]).shape == (1, 8)  # plain ST ignores it
    tampered = tmp_path / "tampered"
    shutil.copytree(saved, tampered)
    state = load_file(tampered / weights)
    save_file({k: v * 1e30 if v.ndim == 2 else v for k, v in state.items()}, tampered / weights)
    with pytest.raises(ModelFileError, match="model.safetensors does not match its checksum") as caught:
        load_calibrated(str(tampered), device="cpu")
    assert "\n" not in str(caught.value) and dense.name in str(caught.value)
    # A listed file deleted is refused too, naming it.
    (tampered / weights).unlink()
    with pytest.raises(ModelFileError, match="is missing"):
        load_calibrated(str(tampered), device="cpu")
