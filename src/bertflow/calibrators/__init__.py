"""Calibrators: maps from raw sentence embeddings to a space where cosine similarity works better.

All follow scikit-learn's estimator contract (see :class:`Calibrator`) and save as safetensors + JSON.
:func:`parse_calibrator` turns the short specs used by the CLI and ``bertflow reproduce`` into objects.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The classes are imported on first use (PEP 562): the CLI reads CALIBRATOR_SPECS for its help text without
# loading torch. The registry of saved calibrator types loads them all when it is asked (base.BUILTIN_MODULES).
_EXPORTS = {
    "AnchoredWhiteningCalibrator": "anchored",
    "AutoCalibrator": "auto",
    "Calibrator": "base",
    "calibrator_names": "base",
    "get_calibrator_class": "base",
    "register": "base",
    "ChainCalibrator": "chain",
    "FlowCalibrator": "flow",
    "FlowTrainer": "flow_trainer",
    "AllButTheTopCalibrator": "simple",
    "IdentityCalibrator": "simple",
    "StandardNormCalibrator": "simple",
    "WhiteningCalibrator": "whitening",
}

if TYPE_CHECKING:
    from .anchored import AnchoredWhiteningCalibrator
    from .auto import AutoCalibrator
    from .base import Calibrator, calibrator_names, get_calibrator_class, register
    from .chain import ChainCalibrator
    from .flow import FlowCalibrator
    from .flow_trainer import FlowTrainer
    from .simple import AllButTheTopCalibrator, IdentityCalibrator, StandardNormCalibrator
    from .whitening import WhiteningCalibrator


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bertflow.calibrators' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Calibrator",
    "FlowCalibrator",
    "FlowTrainer",
    "WhiteningCalibrator",
    "StandardNormCalibrator",
    "AllButTheTopCalibrator",
    "IdentityCalibrator",
    "ChainCalibrator",
    "AnchoredWhiteningCalibrator",
    "AutoCalibrator",
    "register",
    "get_calibrator_class",
    "calibrator_names",
    "parse_calibrator",
    "CALIBRATOR_SPECS",
]

#: Short specs understood by :func:`parse_calibrator` (``+`` chains them, e.g. ``standard-norm+natsv-6``).
CALIBRATOR_SPECS = {
    "none": "no calibration (raw embeddings)",
    "flow": "BERT-flow, the official code's Glow (3 levels x 3 steps, additive, reverse)",
    "flow-paper": "BERT-flow, the paper's Glow (2 levels x 3 steps, additive, random permutation)",
    "whitening": "BERT-whitening keeping every direction",
    "whitening-K": "BERT-whitening keeping the top K directions (e.g. whitening-256)",
    "standard-norm": "per-dimension z-score (SN)",
    "natsv-K": "all-but-the-top: null the top K principal directions (NATSV)",
    "anchored": "anchored whitening: raw cosine mixed with Sigma^-1/4-whitened cosine, weight = anisotropy",
    "anchored-P": "anchored whitening with whitening strength alpha = P/100 (anchored-100: full whitening)",
    "auto": "the recommendation: whitening on raw MLM encoders, anchored on sentence encoders, told apart by spread",
}


def _is_number(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also accepts ``²`` and other digits ``int`` cannot read."""
    return text.isascii() and text.isdigit()


def parse_calibrator(spec: str, **flow_kwargs: object) -> Calibrator:
    """Build an (unfitted) calibrator from a short spec; see :data:`CALIBRATOR_SPECS`.

    Args:
        spec: e.g. ``"flow"``, ``"flow-paper"``, ``"whitening-256"``, ``"standard-norm+natsv-6"``.
        flow_kwargs: extra :class:`FlowCalibrator` arguments (``seed``, ``epochs``, ``device`` ...).
    """
    from ..errors import InputError
    from .anchored import AnchoredWhiteningCalibrator
    from .auto import AutoCalibrator
    from .chain import ChainCalibrator
    from .flow import FlowCalibrator
    from .simple import AllButTheTopCalibrator, IdentityCalibrator, StandardNormCalibrator
    from .whitening import WhiteningCalibrator

    parts = [p.strip().lower() for p in spec.split("+")]
    if len(parts) > 1:
        return ChainCalibrator([parse_calibrator(p, **flow_kwargs) for p in parts])
    name = parts[0]
    base, _, arg = name.rpartition("-") if _is_number(name.rsplit("-", 1)[-1]) else (name, "", "")
    if name in ("none", "raw", "identity"):
        return IdentityCalibrator()
    if name == "flow":
        return FlowCalibrator("code", **flow_kwargs)
    if name == "flow-paper":
        return FlowCalibrator("paper", **flow_kwargs)
    if name == "whitening":
        return WhiteningCalibrator()
    if base == "whitening" and arg:
        return WhiteningCalibrator(int(arg))
    if name in ("standard-norm", "sn"):
        return StandardNormCalibrator()
    if base in ("natsv", "abtt", "all-but-the-top") and arg:
        return AllButTheTopCalibrator(int(arg))
    if name == "auto":
        return AutoCalibrator()
    if name == "anchored":
        return AnchoredWhiteningCalibrator()
    if base == "anchored" and arg:
        if int(arg) > 100:
            raise InputError(f"anchored-P takes a whitening strength P between 0 and 100 (percent), got {arg}")
        return AnchoredWhiteningCalibrator(int(arg) / 100)
    raise InputError(f"unknown calibrator {spec!r}; known: {', '.join(CALIBRATOR_SPECS)} (joined with '+')")
