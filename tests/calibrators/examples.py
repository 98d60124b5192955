"""Instances of every registered calibrator, one per spec it declares: what the contract and scikit-learn tests run
on, so a calibrator added to the registry (one new module) cannot escape them."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings

from bertflow.calibrators import Calibrator, parse_calibrator
from bertflow.calibrators.registry import catalogue

#: How to spell a calibrator that declares no spec of its own (the chain is spelled by joining specs with '+').
UNSPELLED = {"chain": "standard-norm+natsv-1"}

#: The hypothesis settings of the property-based calibrator tests (test_base.py, test_flow.py).
PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def example_specs() -> list[str]:
    """Every declared spec, with 1 (``-K``) or 50 (``-P``, a percentage) for its number, plus :data:`UNSPELLED`."""
    specs = [re.sub(r"-P$", "-50", re.sub(r"-K$", "-1", spec)) for entry in catalogue() for spec in entry.specs]
    return specs + [UNSPELLED[entry.name] for entry in catalogue() if not entry.specs and entry.name in UNSPELLED]


def registry_instances(settings: dict[str, dict[str, Any]] | None = None) -> list[Calibrator]:
    """One unfitted instance per :func:`example_specs`, with ``settings[name]`` (e.g. fewer flow steps) applied."""
    out = []
    for spec in example_specs():
        cal = parse_calibrator(spec)
        out.append(cal.set_params(**(settings or {}).get(cal.name, {})))
    return out


def _data(n: int = 200, d: int = 16, seed: int = 0) -> np.ndarray:
    """``n`` rows of ``d`` correlated, shifted Gaussian features (float64), fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)
