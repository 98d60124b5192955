"""bertflow.integrations.st_anchored: anchored whitening and auto after a token-averaging pooling exported as
sentence-transformers' own modules (reloaded without bertflow, same vectors); after cls pooling they keep the
Calibration module, and the cards say why."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from bertflow import Embedder, SentenceEncoder, WhiteningCalibrator  # noqa: E402
from bertflow.calibrators import AnchoredWhiteningCalibrator, AutoCalibrator  # noqa: E402
from bertflow.card import model_card  # noqa: E402
from bertflow.integrations.st_export import from_embedder  # noqa: E402
from bertflow.portability import calibrator_needs_bertflow  # noqa: E402

from ..conftest import SENTENCES  # noqa: E402
from .conftest import CORPUS, plain_load, worst_without_bertflow  # noqa: E402

ANCHORED_EXPORTS = [
    ("mean", AnchoredWhiteningCalibrator),
    ("first-last-avg", AutoCalibrator),
    ("sif:first-last-avg", AnchoredWhiteningCalibrator),
    ("idf:mean", AutoCalibrator),
]


def test_anchored_and_auto_export_with_sentence_transformers_modules_and_reload_without_bertflow(
    tiny_model_dir, tmp_path
):
    """[sqrt(1-b) x/|x|, sqrt(b) z/|z|] after a token-averaging pooling, with sentence-transformers' own modules
    (bertflow.integrations.st_anchored): each saved folder reloads with plain SentenceTransformer(path) in a process
    where bertflow cannot be imported, and gives the Embedder's vectors."""
    loads = []
    for n, (pooling, calibrator) in enumerate(ANCHORED_EXPORTS):
        encoder = SentenceEncoder(str(tiny_model_dir), pooling=pooling, device="cpu")
        embedder = Embedder(encoder, calibrator()).fit(CORPUS)
        model = from_embedder(embedder)
        names = [type(m).__name__ for m in model]
        assert "Calibration" not in names and names[-3:] == ["HierarchicalTokenPooling", "Pooling", "Dense"], names
        expected = embedder.encode(CORPUS[:10])
        np.testing.assert_allclose(model.encode(CORPUS[:10]), expected, atol=1e-4, err_msg=pooling)
        np.testing.assert_allclose(model.encode_query(CORPUS[:10]), expected, atol=1e-4, err_msg=pooling)
        assert model.get_embedding_dimension() == embedder.calibrator.n_features_out_
        folder = tmp_path / f"st{n}"
        model.save(str(folder))
        assert not list(folder.rglob("*.py"))
        assert "Loads without bertflow: **yes**" in (folder / "README.md").read_text()
        loads.append((plain_load(folder), expected))
    worst = worst_without_bertflow(loads, tmp_path)
    print(f"max abs diff over {len(ANCHORED_EXPORTS)} anchored/auto exports, reloaded without bertflow: {worst:.2e}")
    assert worst <= 1e-4  # a missing block or a wrong scale is off by O(0.1)


@pytest.mark.parametrize("calibrator", [AnchoredWhiteningCalibrator(), AutoCalibrator()], ids=["anchored", "auto"])
def test_anchored_after_cls_pooling_keeps_the_calibration_module_and_the_cards_say_why(
    tiny_model_dir, tmp_path, calibrator
):
    model = Embedder(SentenceEncoder(str(tiny_model_dir), pooling="cls", device="cpu"), calibrator).fit(CORPUS)
    st = from_embedder(model)
    assert type(list(st)[-1]).__name__ == "Calibration"
    assert st.encode(SENTENCES).shape == model.encode(SENTENCES).shape  # (values: the Calibration module's tests)
    st.save(str(tmp_path / "st"))
    card = (tmp_path / "st" / "README.md").read_text()
    reason = calibrator_needs_bertflow(model.calibrator, "cls")
    assert "with cls pooling x is the first token" in reason
    assert "Loads without bertflow: **no**" in card and reason in card
    assert "needs bertflow and `trust_remote_code=True`" in model_card(model)
    assert calibrator_needs_bertflow(model.calibrator, "first-last-avg") is None
    assert (
        calibrator_needs_bertflow(WhiteningCalibrator().fit(np.random.default_rng(0).normal(size=(50, 4))), "cls")
        is None
    )
