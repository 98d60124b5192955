"""Uploads (hub.py): Embedder.push_to_hub with HfApi replaced by a recorder, and offline errors."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow import (
    Embedder,
    InputError,
    NotFittedError,
    WhiteningCalibrator,
)
from bertflow.calibrators import StandardNormCalibrator
from bertflow.errors import OutputError
from bertflow.hub import push

from .conftest import CORPUS, SENTENCES


def test_push_to_hub_uploads_the_saved_folder(tiny_encoder, tmp_path, monkeypatch):
    """create_repo + create_branch + upload_folder of a folder Embedder.load accepts; nothing leaves the machine
    (HfApi's methods are replaced by recorders) and an unfitted model is refused before any call."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    calls: list[tuple[str, dict]] = []

    def upload_folder(self, **kw):
        import shutil

        kept = tmp_path / "uploaded"
        shutil.copytree(kw["folder_path"], kept)  # the temporary folder is gone after the call
        calls.append(("upload_folder", {**kw, "folder_path": kept}))
        return SimpleNamespace(commit_url="https://huggingface.co/me/flow/commit/123")

    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create_repo", {**kw, "repo_id": repo_id}))
    )
    monkeypatch.setattr(HfApi, "create_branch", lambda self, repo_id, **kw: calls.append(("create_branch", kw)))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    with pytest.raises(NotFittedError):
        push(Embedder(tiny_encoder, WhiteningCalibrator()), "me/flow")
    assert calls == []
    model = Embedder(tiny_encoder, WhiteningCalibrator()).fit(CORPUS)
    with pytest.raises(InputError, match="repo_id"):
        push(model, "../flow")
    # A local encoder folder names nothing on the Hub: it is pushed only bundled.
    with pytest.raises(InputError, match="include_encoder=True"):
        push(model, "me/flow")
    assert calls == []
    url = push(
        model, "me/flow", private=True, token="hf_x", revision="v1", commit_message="first", include_encoder=True
    )
    assert url.endswith("/commit/123")
    assert [name for name, _ in calls] == ["create_repo", "create_branch", "upload_folder"]
    expected = {"repo_id": "me/flow", "token": "hf_x", "private": True, "repo_type": "model", "exist_ok": True}
    assert calls[0][1] == expected
    assert calls[1][1]["branch"] == "v1" and calls[2][1]["revision"] == "v1"
    upload = calls[2][1]
    assert upload["repo_id"] == "me/flow" and upload["commit_message"] == "first" and upload["token"] == "hf_x"
    pushed = Embedder.load(upload["folder_path"], device="cpu")
    np.testing.assert_array_equal(pushed.encode(SENTENCES), model.encode(SENTENCES))
    assert model.source is None


def test_push_to_hub_offline_is_one_error_naming_hf_hub_offline(tiny_encoder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    model = Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS)
    with pytest.raises(OutputError, match="HF_HUB_OFFLINE") as caught:
        push(model, "someone/my-flow", include_encoder=True)  # a local encoder is pushed only bundled
    assert "\n" not in str(caught.value)
