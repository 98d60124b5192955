"""Core encoding: text to pooled sentence vectors with a frozen transformer.

``encoder`` (:class:`SentenceEncoder`, the one encoding path), ``settings`` (its public throughput knobs,
:class:`EncodeSettings`), ``loading`` (model names, the packaged default, hub cache, provenance), ``batching``
(chunks, length-sorted token-budget batches, host buffers), ``forward`` (the forward pass: any number of poolings
from one pass, an optional device transform, one copy to the host), ``device`` (device, dtype, attention kernels),
``pooling`` (which hidden states become a sentence vector) and ``tokenization`` (the fast tokenizing path).
Nothing here knows about calibration, files or processes.
"""
