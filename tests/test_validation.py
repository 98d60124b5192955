"""Output checks (validation.py): output_limit / check_calibrated let large but plausible outputs through."""

from __future__ import annotations

import numpy as np

from bertflow import (
    Embedder,
    StandardNormCalibrator,
    WhiteningCalibrator,
)

from .calibrators.examples import _data
from .conftest import CORPUS


def test_large_but_plausible_outputs_pass(tiny_encoder):
    """Held-out rows far from the fitting data (10x their spread) still calibrate: the bound is not a tripwire."""
    x = _data(300, 16)
    cal = WhiteningCalibrator().fit(x)
    far = cal.mean_ + 10 * (x[:5] - cal.mean_)
    assert np.isfinite(cal.transform(far)).all()
    assert np.isfinite(Embedder(tiny_encoder, StandardNormCalibrator()).fit(CORPUS[:8]).encode(CORPUS)).all()


def test_check_sentences_fast_path_agrees_with_the_item_rule():
    """The joined C-loop pass of check_sentences accepts exactly what the per-item rule accepts, and a refused
    list names the first bad item, whatever else the list holds (ASCII, other scripts, surrogates, non-strings)."""
    import pytest

    from bertflow.errors import InputError
    from bertflow.validation import _BLANK, _strip_blank, check_sentence, check_sentences

    # The strip set is exactly what the blank rule matches, over every code point.
    assert all((_BLANK.fullmatch(chr(c)) is not None) == (_strip_blank(chr(c)) == "") for c in range(0x110000))
    good = ["A man plays.", "Ünïcödé text", "日本語", " padded\u3000", "x\u200b"]
    check_sentences(good)
    for bad in ["", " \t", "\u200b\ufeff", "\x00", "\u3000\u2028", "ok \ud800 no", None, 3, b"bytes"]:
        items = [*good, bad, "later"]
        with pytest.raises(InputError) as caught:
            check_sentences(items, offset=10)
        with pytest.raises(InputError) as expected:
            check_sentence(10 + len(good), bad)
        assert str(caught.value) == str(expected.value)

    # Lists longer than one C-loop slice: the first bad item is named by its place in the whole list.
    from bertflow.validation import CHECK_SLICE

    many = good * (3 * CHECK_SLICE // len(good))
    for first in (0, CHECK_SLICE - 1, CHECK_SLICE, 2 * CHECK_SLICE + 7):
        items = list(many)
        items[first] = ""
        items[-1] = None  # a later bad item, in another slice
        with pytest.raises(InputError) as caught:
            check_sentences(items, offset=10)
        with pytest.raises(InputError) as expected:
            check_sentence(10 + first, "")
        assert str(caught.value) == str(expected.value)
    check_sentences(many)
