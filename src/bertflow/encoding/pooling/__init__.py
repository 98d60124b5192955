"""Pooling: how a sentence vector is read out of a transformer's token states, always explicit, validated against
the model, never guessed from its name. The contract and spec syntax are in :mod:`.base`, one module per family
(:mod:`.token`, :mod:`.layers`), token weightings in :mod:`.weighting`; every module here is imported below, so a
pooling class defined in a new module is registered without editing any list.
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
