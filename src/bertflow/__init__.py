"""bertflow: label-free calibration of transformer sentence embeddings (BERT-flow and friends).

The public surface::

    SentenceEncoder   a frozen Hugging Face encoder + explicit pooling -> float32 vectors
    FlowCalibrator    BERT-flow (Glow), WhiteningCalibrator, StandardNormCalibrator, AllButTheTopCalibrator,
                      ChainCalibrator, IdentityCalibrator, AnchoredWhiteningCalibrator, AutoCalibrator:
                      scikit-learn fit / transform
    Embedder          encoder + calibrator: fit, encode, similarity, search, save, load
    EmbeddingIndex    exact (torch) or FAISS top-k cosine search, saved with the model it was built with
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .calibrators.registry import catalogue as _catalogue  # light: it reads sources, imports no calibrator

# Names are imported on first use (PEP 562), so `import bertflow` and `bertflow --help` do not load torch,
# transformers or scikit-learn until something needs them. Every registered calibrator class is exported too, by
# its class name: the calibrator registry lists them (bertflow.calibrators.__all__), not this module.
_EXPORTS = {
    "DEFAULT_MODEL": "encoding.loading",
    "SentenceEncoder": "encoding.encoder",
    "Embedder": "embedder",
    "EmbeddingIndex": "search.index",
    "SearchHit": "search.index",
    "parse_calibrator": "calibrators",
    "BertflowError": "errors",
    "InputError": "errors",
    "NotFittedError": "errors",
    "ModelFileError": "errors",
    "CompatibilityError": "errors",
    "DivergenceError": "errors",
}

_EXPORTS.update(dict.fromkeys(["Calibrator", *(entry.class_name for entry in _catalogue())], "calibrators"))

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # what static tools and IDEs see
    from .calibrators import parse_calibrator
    from .embedder import Embedder
    from .encoding.encoder import SentenceEncoder
    from .encoding.loading import DEFAULT_MODEL
    from .errors import (
        BertflowError,
        CompatibilityError,
        DivergenceError,
        InputError,
        ModelFileError,
        NotFittedError,
    )
    from .search.index import EmbeddingIndex, SearchHit


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bertflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
