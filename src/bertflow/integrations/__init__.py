"""Bridges to other libraries. Each submodule imports its library on import, so import only the one you use:

- :mod:`bertflow.integrations.sentence_transformers`: a fitted calibrator as a sentence-transformers module
  (``pip install 'bertflow[st]'``); ``Embedder.to_sentence_transformer()`` converts a whole model.
- :mod:`bertflow.integrations.mteb`: a fitted Embedder as an mteb 2.x encoder (``mteb.evaluate(embedder, tasks)``)
  and local STS files as an MTEB task (``pip install 'bertflow[mteb]'``).
"""

from __future__ import annotations
