"""Calibrators: maps from raw sentence embeddings to a space where cosine similarity works better.

All follow scikit-learn's estimator contract (see :class:`Calibrator`) and save as safetensors + JSON.
:func:`parse_calibrator` turns the short specs used by the CLI and ``bertflow reproduce`` into objects.

Every registered calibrator class is importable from here by its class name (``from bertflow.calibrators import
WhiteningCalibrator``): the names come from the registry (:mod:`bertflow.calibrators.registry`), which discovers the
calibrator modules, so a new calibrator is one new module and no list here. Classes are imported on first use (PEP
562): the CLI reads the specs for its help text without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registry import calibrator_names, calibrator_specs, catalogue, get_calibrator_class, parse_calibrator, register


def _modules() -> dict[str, str]:
    """The module holding each lazily exported name: the base class and every registered calibrator class."""
    return {"Calibrator": f"{__name__}.base", **{entry.class_name: entry.module for entry in catalogue()}}


def __getattr__(name: str) -> Any:
    module = _modules().get(name)
    if module is None:
        raise AttributeError(f"module 'bertflow.calibrators' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    *_modules(),
    "calibrator_names",
    "calibrator_specs",
    "get_calibrator_class",
    "parse_calibrator",
    "register",
]
