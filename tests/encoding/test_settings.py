"""EncodeSettings: the public throughput knobs of SentenceEncoder (validated; replaceable; never change vectors)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bertflow import InputError, SentenceEncoder
from bertflow.encoding.settings import EncodeSettings

from ..conftest import SENTENCES


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("max_tokens", 0, "max_tokens must be a positive integer"),
        ("chunk_size", -3, "chunk_size must be a positive integer"),
        ("first_chunk", 2.5, "first_chunk must be a positive integer"),
        ("tokenize_workers", -1, "tokenize_workers must be 0 or more"),
        ("tokenize_processes", True, "tokenize_processes must be 0 or more"),
        ("min_tokens", -5, "min_tokens must be 0 or more"),
        ("uniform_fill", float("nan"), "uniform_fill must be a number of 0 or more"),
        ("min_length_ratio", 1.5, "min_length_ratio must be at most 1"),
        ("cudnn_attention", "yes", "cudnn_attention must be True or False"),
    ],
)
def test_bad_settings_are_refused_in_one_line(field, value, match):
    with pytest.raises(InputError, match=match) as info:
        EncodeSettings(**{field: value})
    assert "\n" not in str(info.value)


def test_length_ratio_bounds_padding_only_where_the_forward_pays_for_it():
    """``min_length_ratio=None``: 0.9 of the batch width for a padded forward, no bound for the packed one (real
    tokens only); a value given wins on both."""
    s = EncodeSettings()
    assert s.min_length_ratio is None
    assert (s.length_ratio(padding_free=False), s.length_ratio(padding_free=True)) == (0.9, 0.0)
    given = dataclasses.replace(s, min_length_ratio=0.5)
    assert (given.length_ratio(False), given.length_ratio(True)) == (0.5, 0.5)


def test_device_defaults_fill_the_none_fields():
    s = EncodeSettings()
    assert (s.token_budget("cpu"), s.token_budget("cuda")) == (4096, 65536)
    assert (s.min_batch_tokens("cpu"), s.min_batch_tokens("cuda")) == (0, 32768)
    assert dataclasses.replace(s, max_tokens=100, min_tokens=7).token_budget("cuda") == 100
    assert dataclasses.replace(s, min_tokens=7).min_batch_tokens("cuda") == 7


def test_cuda_batch_sizes_grow_for_narrow_models():
    """A model narrower than BERT-base gets a larger CUDA budget and floor, by the square of the width ratio (so
    a batch holds about the same work); CPU, wide models and given values don't change."""
    s = EncodeSettings()
    assert s.min_batch_tokens("cuda", 768) == s.min_batch_tokens("cuda", 1024) == 32768
    assert s.token_budget("cuda", 768) == s.token_budget("cuda", 1024) == s.token_budget("cuda") == 65536
    assert (s.token_budget("cuda", 384), s.min_batch_tokens("cuda", 384)) == (262144, 131072)  # 4x
    assert (s.token_budget("cuda", 512), s.min_batch_tokens("cuda", 512)) == (147456, 73728)  # 2.25x
    assert (s.token_budget("cuda", 128), s.min_batch_tokens("cuda", 128)) == (262144, 131072)  # at most 4x
    assert (s.token_budget("cpu", 384), s.min_batch_tokens("cpu", 384)) == (4096, 0)
    given = dataclasses.replace(s, max_tokens=100000)
    assert (given.token_budget("cuda", 384), given.min_batch_tokens("cuda", 384)) == (100000, 100000)  # capped
    assert dataclasses.replace(s, min_tokens=7).min_batch_tokens("cuda", 384) == 7


def test_keyword_shortcuts_and_settings_meet(tiny_model_dir):
    base = EncodeSettings(max_tokens=64, uniform_fill=0.25)
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", settings=base, tokenize_workers=0)
    assert enc.settings == dataclasses.replace(base, tokenize_workers=0)  # the shortcut wins over its field
    assert (enc.max_tokens, enc.tokenize_workers, enc.token_budget) == (64, 0, 64)
    enc.max_tokens = 128  # the old attributes write through to the settings
    assert enc.settings.max_tokens == 128 and enc.settings.uniform_fill == 0.25
    with pytest.raises(InputError, match="max_tokens must be a positive integer"):
        enc.max_tokens = 0
    with pytest.raises(InputError, match="settings must be an EncodeSettings"):
        enc.settings = {"max_tokens": 5}


def test_settings_change_batches_but_not_vectors(tiny_model_dir):
    enc = SentenceEncoder(str(tiny_model_dir), device="cpu", tokenize_workers=0)
    ref = enc.encode(SENTENCES)
    batches = enc.last_stats.batches
    enc.settings = dataclasses.replace(
        enc.settings, max_tokens=16, uniform_fill=0.0, min_length_ratio=1.0, chunk_size=3
    )
    out = enc.encode(SENTENCES)
    assert enc.last_stats.batches > batches and enc.last_stats.chunk_sizes[0] == 3  # the settings were used
    np.testing.assert_allclose(out, ref, atol=1e-5)
