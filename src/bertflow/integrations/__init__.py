"""Bridges to other libraries. Each submodule imports its library on import, so import only the one you use:

- :mod:`bertflow.integrations.sentence_transformers`: a fitted calibrator as a sentence-transformers module
  (``pip install 'bertflow[st]'``).
- :mod:`bertflow.integrations.map_step`: :class:`~bertflow.integrations.map_step.MapEncoder`, a map step for Ray
  Data, Spark or a process pool (batches of text in, an embedding column out).
"""

from __future__ import annotations
