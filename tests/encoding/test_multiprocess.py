"""encode_multi_device (encoding/multiprocess.py): CPU workers give what one process gives."""

from __future__ import annotations

import numpy as np

from ..conftest import SENTENCES
from ..test_embedder import encoder  # noqa: F401 - the fixture


def test_encode_multi_device_carries_the_statistics(encoder):  # noqa: F811
    from bertflow.encoding.multiprocess import encode_multi_device

    encoder.token_statistics = encoder.count_tokens(SENTENCES)
    got = encode_multi_device(SENTENCES, encoder, ["cpu", "cpu"], threads_per_process=1, chunk_size=4)
    np.testing.assert_allclose(got, encoder.encode(SENTENCES), atol=1e-6)
