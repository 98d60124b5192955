"""check_format, verify_checksums and path_inside (io/formats.py): a model folder's format and checksums are checked
before it is used."""

from __future__ import annotations

import pytest

from bertflow.errors import ModelFileError
from bertflow.io.formats import check_format


def test_check_format_names_the_file_and_the_way_out(tmp_path):
    path = tmp_path / "config.json"
    assert check_format({"format_version": 1}, path, kind="model") == 1
    with pytest.raises(ModelFileError, match=r"config.json is a model written by bertflow 9.9 in format 2; .* upgrade"):
        check_format({"format_version": 2, "bertflow_version": "9.9"}, path, kind="model")
    assert check_format({"format_version": 2}, path, kind="embedding store", current=2) == 2
    for edited in ({}, {"format_version": "1"}, {"format_version": True}, {"format_version": 1.0}):
        with pytest.raises(ModelFileError, match="config.json has no valid format_version .* was it edited"):
            check_format(edited, path, kind="model")
