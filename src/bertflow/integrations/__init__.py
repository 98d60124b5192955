"""Bridges to other libraries. Each submodule imports its library on import, so import only the one you use:

- :mod:`bertflow.integrations.sentence_transformers`: a fitted calibrator as a sentence-transformers module
  (``Calibration``) and the guarded loader of a saved calibrated model (``pip install 'bertflow[st]'``);
  :mod:`bertflow.integrations.st_export` builds one: ``fit_calibrator(st_model, ...)``, ``from_embedder(embedder)``
  (with :mod:`bertflow.integrations.st_anchored` for anchored whitening and auto).
- :mod:`bertflow.integrations.mteb`: a fitted Embedder as an mteb 2.x encoder
  (``mteb.evaluate(MTEBEncoder(embedder), tasks)``) and local STS files as an MTEB task
  (``pip install 'bertflow[mteb]'``).
- :mod:`bertflow.integrations.map_step`: :class:`~bertflow.integrations.map_step.MapEncoder`, a map step for Ray
  Data, Spark or a process pool (batches of text in, an embedding column out).
"""

from __future__ import annotations
