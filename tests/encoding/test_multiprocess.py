"""encode_multi_device (encoding/multiprocess.py): CPU workers give what one process gives."""

from __future__ import annotations

import numpy as np

from bertflow import SentenceEncoder
from bertflow.encoding.multiprocess import encode_multi_device

from ..conftest import SENTENCES
from ..scale.conftest import make_lines, reference
from ..test_embedder import encoder  # noqa: F401 - the fixture


def test_encode_multi_device_carries_the_statistics(encoder):  # noqa: F811
    encoder.token_statistics = encoder.count_tokens(SENTENCES)
    got = encode_multi_device(SENTENCES, encoder, ["cpu", "cpu"], threads_per_process=1, chunk_size=4)
    np.testing.assert_allclose(got, encoder.encode(SENTENCES), atol=1e-6)


def test_encode_multi_device_equals_one_process(tiny_model_dir):
    encoder = SentenceEncoder(str(tiny_model_dir), pooling="mean", device="cpu")  # noqa: F811
    lines = make_lines(150, seed=2)
    got = encode_multi_device(lines, encoder, ["cpu", "cpu"], batch_size=8, chunk_size=16, threads_per_process=1)
    np.testing.assert_array_equal(got, reference(encoder, lines, batch_size=8, chunk_size=16))
