"""check_format, verify_checksums and path_inside (io/formats.py): a model folder's format and checksums are checked
before it is used."""

from __future__ import annotations

import pytest

from bertflow import (
    Embedder,
    WhiteningCalibrator,
)
from bertflow.errors import ModelFileError
from bertflow.io.formats import check_format

from ..conftest import CORPUS


def test_check_format_names_the_file_and_the_way_out(tmp_path):
    path = tmp_path / "config.json"
    assert check_format({"format_version": 1}, path, kind="model") == 1
    with pytest.raises(ModelFileError, match=r"config.json is a model written by bertflow 9.9 in format 2; .* upgrade"):
        check_format({"format_version": 2, "bertflow_version": "9.9"}, path, kind="model")
    assert check_format({"format_version": 2}, path, kind="embedding store", current=2) == 2
    for edited in ({}, {"format_version": "1"}, {"format_version": True}, {"format_version": 1.0}):
        with pytest.raises(ModelFileError, match="config.json has no valid format_version .* was it edited"):
            check_format(edited, path, kind="model")


def _edit_config(folder, edit) -> None:
    import json

    path = folder / "bertflow_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


@pytest.fixture()
def saved(tiny_encoder, tmp_path):
    return Embedder(tiny_encoder, WhiteningCalibrator(4)).fit(CORPUS).save(tmp_path / "model")


@pytest.mark.parametrize("how", ["deleted", "emptied", "garbled"])
def test_a_config_without_its_checksums_is_refused(saved, how):
    from bertflow import ModelFileError

    def strip(config):
        if how == "deleted":
            del config["files"]
        else:
            config["files"] = {} if how == "emptied" else ["calibrator/model.safetensors"]

    _edit_config(saved, strip)
    with pytest.raises(ModelFileError, match="no 'files' checksums"):
        Embedder.load(saved)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("calibrator", "../other/calibrator"),
        ("calibrator", "/OTHER/calibrator"),
        ("calibrator", "calibrator/../../other/calibrator"),
        ("encoder", "../other/encoder"),
        ("files", "../other/calibrator/model.safetensors"),
    ],
)
def test_paths_in_the_config_may_not_leave_the_folder(tiny_encoder, saved, tmp_path, key, value):
    """Another (valid, differently fitted) model next door: its calibrator must not be loaded through this config."""
    from bertflow import ModelFileError

    other = Embedder(tiny_encoder, WhiteningCalibrator(3)).fit(CORPUS[:40])
    other = other.save(tmp_path / "other", include_encoder=True)
    value = value.replace("/OTHER", str(other))

    def point_outside(config):
        if key == "files":
            config["files"][value] = config["files"].pop("calibrator/model.safetensors")
        else:
            config[key]["path"] = value

    _edit_config(saved, point_outside)
    with pytest.raises(ModelFileError, match="not a path inside the folder"):
        Embedder.load(saved)


def test_a_file_without_a_checksum_is_refused(saved):
    """A file slipped into a folder the loader reads (or one whose entry was removed from the list) is refused."""
    from bertflow import ModelFileError

    _edit_config(saved, lambda config: config["files"].pop("calibrator/config.json"))
    with pytest.raises(ModelFileError, match="config.json has no checksum"):
        Embedder.load(saved)
