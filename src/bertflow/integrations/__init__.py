"""Bridges to other libraries. Each submodule imports its library on import, so import only the one you use:

- :mod:`bertflow.integrations.sentence_transformers`: a fitted calibrator as a sentence-transformers module
  (``pip install 'bertflow[st]'``).
"""

from __future__ import annotations
