"""Normalizing-flow core of bertflow: a small Glow fitted on frozen sentence embeddings.

Every transform maps data -> latent in ``forward`` and returns the per-sample ``log|det dy/dx|``; see
:mod:`bertflow.flows.base` for the sign convention.
"""

from __future__ import annotations

from bertflow.flows.actnorm import ActNorm
from bertflow.flows.base import Composite, Transform
from bertflow.flows.coupling import AdditiveCoupling, AffineCoupling
from bertflow.flows.glow import GLOW_PRESETS, FlowStep, Glow
from bertflow.flows.permutation import InvertibleLinearLU, RandomPermutation, ReversePermutation

__all__ = [
    "Transform",
    "Composite",
    "ActNorm",
    "ReversePermutation",
    "RandomPermutation",
    "InvertibleLinearLU",
    "AdditiveCoupling",
    "AffineCoupling",
    "FlowStep",
    "Glow",
    "GLOW_PRESETS",
]
