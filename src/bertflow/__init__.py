"""bertflow: label-free calibration of transformer sentence embeddings (BERT-flow and friends).

The public surface::

    SentenceEncoder   a frozen Hugging Face encoder + explicit pooling -> float32 vectors
    FlowCalibrator    BERT-flow (Glow), WhiteningCalibrator, StandardNormCalibrator, AllButTheTopCalibrator,
                      ChainCalibrator, IdentityCalibrator: scikit-learn-style fit / transform
    Embedder          encoder + calibrator: fit, encode, similarity, search, save, load
    EmbeddingIndex    exact (torch) or FAISS top-k cosine search, saved with the model it was built with
"""

from __future__ import annotations

__version__ = "0.1.0"

from .calibrators import (  # noqa: E402 - __version__ must exist before submodules import it
    AllButTheTopCalibrator,
    Calibrator,
    ChainCalibrator,
    FlowCalibrator,
    IdentityCalibrator,
    StandardNormCalibrator,
    WhiteningCalibrator,
    parse_calibrator,
)
from .encoder import DEFAULT_MODEL, SentenceEncoder  # noqa: E402
from .errors import (  # noqa: E402
    BertflowError,
    CompatibilityError,
    DivergenceError,
    InputError,
    ModelFileError,
    NotFittedError,
)
from .pipeline import Embedder  # noqa: E402
from .search import EmbeddingIndex, SearchHit  # noqa: E402

__all__ = [
    "__version__",
    "DEFAULT_MODEL",
    "SentenceEncoder",
    "Embedder",
    "EmbeddingIndex",
    "SearchHit",
    "Calibrator",
    "FlowCalibrator",
    "WhiteningCalibrator",
    "StandardNormCalibrator",
    "AllButTheTopCalibrator",
    "ChainCalibrator",
    "IdentityCalibrator",
    "parse_calibrator",
    "BertflowError",
    "InputError",
    "NotFittedError",
    "ModelFileError",
    "CompatibilityError",
    "DivergenceError",
]
