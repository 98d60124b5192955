"""`bertflow analyze` end to end: its checks come before any work."""

from __future__ import annotations

from ..conftest import invoke, one_line_error


def test_analyze_without_matplotlib_fails_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    from bertflow.encoding.encoder import SentenceEncoder

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))

    def no_loading(*args, **kwargs):
        raise AssertionError("the encoder was loaded before the missing dependency was reported")

    monkeypatch.setattr(SentenceEncoder, "__init__", no_loading)
    out = tmp_path / "analysis"
    one_line_error(invoke("analyze", "-o", out, "-q"), "matplotlib", "--no-plots")
    assert not out.exists()
