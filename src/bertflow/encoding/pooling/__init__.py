"""Pooling: how a sentence vector is read out of a transformer's token states.

Pooling is always explicit and validated against the model; it is never guessed from the model's name. The
contract and the spec syntax are in :mod:`.base`; each family of poolings is one module (:mod:`.token`: ``cls``,
``pooler``; :mod:`.layers`: ``mean``, ``first-last-avg``, ``last2avg``, index lists), and token weightings
(SIF, uSIF, IDF) are in :mod:`.weighting`. Every module of this package is imported here, so a pooling class
defined in a new module is registered without editing any list.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Pooling, masked_mean, parse_without_model, pooling_names, registered_poolings
from .weighting import NO_WEIGHTING, Weighting

__all__ = [
    "NO_WEIGHTING",
    "Pooling",
    "Weighting",
    "masked_mean",
    "parse_without_model",
    "pooling_names",
    "registered_poolings",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
