"""`bertflow download-sts` end to end."""

from __future__ import annotations

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
