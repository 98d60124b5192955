"""`bertflow download-sts` end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import invoke


def test_download_sts_quiet(tmp_path):
    """A completed download is not redone: without -q the progress line says so on stderr, with -q nothing."""
    from bertflow.evaluation.download import _COMPLETE_MARKER

    (tmp_path / _COMPLETE_MARKER).write_text("complete\n")
    r = invoke("download-sts", "-o", tmp_path)
    assert r.exit_code == 0 and r.stdout.strip() == str(tmp_path)
    assert "already downloaded" in r.stderr
    r = invoke("download-sts", "-o", tmp_path, "-q")
    assert r.exit_code == 0 and r.stdout.strip() == str(tmp_path) and r.stderr == ""


def test_cli_download_sts_fails_fast_with_advice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from bertflow.errors import DataNotFoundError
    from bertflow.evaluation import download as data

    def offline(*_a: object, **_k: object) -> Path:
        raise DataNotFoundError("cannot download the STS data: network unreachable. Use --data-dir PATH")

    monkeypatch.setattr(data, "download_sts", offline)
    r = invoke("download-sts", "-o", tmp_path / "sts")
    assert r.exit_code == 2 and "--data-dir" in r.stderr
