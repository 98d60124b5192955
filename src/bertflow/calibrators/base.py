"""The calibrator contract: a scikit-learn transformer plus safetensors + JSON persistence.

A calibrator maps sentence embeddings [N, D] to calibrated embeddings [N, D'] in which cosine similarity is
taken. ``__init__`` only stores hyperparameters; ``fit`` validates them and sets fitted attributes whose names end
in ``_``; using an unfitted calibrator raises :class:`~bertflow.errors.NotFittedError`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils import Tags
from sklearn.utils.validation import validate_data

from .._version import __version__
from ..errors import CompatibilityError, InputError, ModelFileError, NotFittedError
from ..io.formats import FORMAT_VERSION, check_format, load_arrays, read_json, save_arrays, write_json
from ..typing import TorchTransform
from ..validation import check_array, check_calibrated
from .registry import get_calibrator_class

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

#: Fitting rows that differ by less than this fraction of their largest coordinate are taken as equal. Embeddings
#: are float32 (24 significant bits, 6e-8 relative), so rows closer than 1e-5 differ by rounding noise (batch
#: composition, summation order) at most, not by meaning; every calibrator would scale that noise up to unit
#: variance or divide by it.
SPREAD_RTOL = 1e-5


def no_variance_message(n: int | None = None) -> str:
    """The error for fitting data without variance (shared by the row and the moments checks)."""
    rows = f"the {n} fitting embeddings" if n is not None else "the fitting embeddings"
    return (
        f"{rows} are all equal (duplicates of one sentence, or equal up to float32 rounding): there is no variance "
        "to calibrate; fit on distinct sentences"
    )


def check_spread(X: np.ndarray) -> None:
    """Raise :class:`~bertflow.errors.InputError` if the rows of ``X`` [N, D] are all equal up to :data:`SPREAD_RTOL`
    (whitening would keep 0 directions, standard-norm divide by 1e-12, the flow fit a point mass)."""
    high, low = X.max(axis=0), X.min(axis=0)
    spread, magnitude = float((high - low).max()), max(float(high.max()), -float(low.min()))
    if not spread > SPREAD_RTOL * magnitude:
        raise InputError(no_variance_message(len(X)))


class Calibrator(TransformerMixin, BaseEstimator, ABC):
    """Base class of every calibrator: a scikit-learn transformer, so ``clone``, ``Pipeline``, ``GridSearchCV``,
    ``set_output`` and ``get_feature_names_out`` work and ``sklearn.utils.estimator_checks`` passes
    (``tests/calibrators/test_sklearn.py`` lists the checks skipped, and why).

    ``transform`` always returns **float32** (the fit computes in float64): embeddings are float32 throughout
    bertflow, and it holds every digit a cosine can use; the tag ``transformer_tags.preserves_dtype`` says so.

    Subclasses implement ``_fit(X)`` and ``_transform(X)`` on validated float64 arrays, and ``_get_state() -> (meta,
    arrays)`` / ``_set_state(meta, arrays)``; the public methods here validate, check fitting and cast once for all.
    Output columns are named ``<classname><i>``, or keep the input's names where ``_one_to_one``. Every ``__init__``
    parameter must be JSON-serialisable (numbers, strings, lists, ``None``; nested calibrators for the chain).
    """

    #: The registry name (the ``type`` of a saved config), set by :func:`~bertflow.calibrators.registry.register`.
    name: ClassVar[str] = "calibrator"
    #: The short specs this class is built from (spec -> one line of help; ``-K`` / ``-P`` mark a number), read by
    #: :func:`~bertflow.calibrators.registry.parse_calibrator` and the CLI help. A literal dict, declared on the class
    #: itself (never inherited: the registry reads each class's own).
    specs: ClassVar[dict[str, str]] = {}
    #: Other spellings of a spec (alias -> spec), e.g. ``{"sn": "standard-norm"}``. A literal dict.
    aliases: ClassVar[dict[str, str]] = {}
    #: Whether ``transform`` is exactly ``x -> (x - mean) @ W`` (exported as sentence-transformers' ``Dense``). Read
    #: from the class itself, never inherited: a subclass may add a non-linear step.
    affine: ClassVar[bool] = False
    #: Whether the map rescales directions by their fitted variance (whitening-type): such a calibrator fitted on
    #: fewer than 2 D sentences is likely worse than the raw encoder, and the fit warns
    #: (:func:`~bertflow.calibrators.auto.no_harm_warning`). Read from the class itself, never inherited.
    rescales_variance: ClassVar[bool] = False
    #: dtype of the array ``_fit`` receives. float64 for the closed-form calibrators; the flow trains in float32
    #: and takes float32 so that fitting a million embeddings does not start with a 6 GB float64 copy.
    _fit_dtype: ClassVar[type] = np.float64
    #: Whether fitting refuses rows that are all equal (:func:`check_spread`); only the identity does without.
    _needs_variance: ClassVar[bool] = True
    #: Whether output column i is input column i transformed (feature names pass through).
    _one_to_one: ClassVar[bool] = False

    @classmethod
    def from_spec(cls, spec: str, number: int | None, **options: Any) -> Calibrator:
        """An unfitted instance for one of :attr:`specs` (``number``: the ``K`` of a numbered spec, else ``None``);
        by default ``number`` is the first argument and ``options`` (the flow's) are ignored."""
        return cls() if number is None else cls(number)

    def is_affine(self) -> bool:
        """Whether this calibrator's map is affine (see :attr:`affine`; a chain is when all its steps are)."""
        return bool(vars(type(self)).get("affine", False))

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float32"]  # see the class docstring
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        return self.is_fitted

    def __repr__(self) -> str:
        """One line with the parameters that differ from their defaults, e.g. ``WhiteningCalibrator(n_components=256)``
        (not scikit-learn's multi-line repr: it goes into model cards' table cells, JSON summaries and logs)."""
        defaults = {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values() if p.name != "self"
        }
        shown = [f"{k}={v!r}" for k, v in self.get_params(deep=False).items() if defaults.get(k, inspect._empty) != v]
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def is_fitted(self) -> bool:
        """True once ``fit`` (or loading) has set ``n_features_in_``."""
        return hasattr(self, "n_features_in_")

    def check_fitted(self) -> None:
        """Raise :class:`~bertflow.errors.NotFittedError` (one line) unless ``fit`` or loading has run."""
        if not self.is_fitted:
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit(X) with embeddings first")

    def fitted_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``(meta, arrays)``: the fitted state exactly as :meth:`save` writes it (JSON-able meta, named arrays)."""
        self.check_fitted()
        return self._get_state()

    def get_feature_names_out(self, input_features: Sequence[str] | None = None) -> np.ndarray:
        """Names of the output columns (object array [n_features_out_]), as scikit-learn's transformers give them."""
        self.check_fitted()
        if self._one_to_one:
            return OneToOneFeatureMixin.get_feature_names_out(self, input_features)
        return ClassNamePrefixFeaturesOutMixin.get_feature_names_out(self, input_features)

    @property
    def _n_features_out(self) -> int:
        """What ``ClassNamePrefixFeaturesOutMixin`` reads."""
        return self.n_features_out_

    def fit(self, X: np.ndarray, y: object = None) -> Calibrator:
        """Fit on embeddings ``X`` [N, D] (``y`` is ignored; it exists for pipelines). Returns ``self``."""
        arr = check_array(X, what="X", min_rows=self.min_rows(), dtype=self._fit_dtype, owner=type(self).__name__)
        self.check_params(arr)
        if self._needs_variance:
            check_spread(arr)
        self._reset_fitted()
        self._fit(arr)
        # Sets n_features_in_, and feature_names_in_ when X is a DataFrame with string column names.
        validate_data(self, X, reset=True, skip_check_array=True)
        return self

    def _reset_fitted(self) -> None:
        """Forget every fitted attribute (those ending in ``_``); every route that fits calls it first, so nothing of
        an earlier fit survives a refit and a failed refit leaves no fitted marker."""
        for attr in [a for a in vars(self) if a.endswith("_") and not a.startswith("__")]:
            delattr(self, attr)

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Calibrate embeddings [N, D] -> **float32** [N, D_out], whatever the input dtype.

        A 1-D vector [D] gives a 1-D result [D_out] (one sentence); scikit-learn's transformers refuse 1-D input.
        """
        self.check_fitted()
        single = np.asarray(X).ndim == 1  # np.asarray: np.ndim would go through __array_function__
        arr = check_array(
            np.atleast_2d(X) if single else X, n_features=self.n_features_in_, what="X", owner=type(self).__name__
        )
        if not single:  # warns when the columns of a DataFrame differ from those fitted on
            validate_data(self, X, reset=False, skip_check_array=True)
        out = self._transform(arr).astype(np.float32)
        check_calibrated(out, arr, what=f"this {type(self).__name__}")
        return out[0] if single else out

    def transform64(self, X: np.ndarray) -> np.ndarray:
        """The map in float64: [N, D] -> float64 [N, D_out], what :meth:`transform` computes before its float32
        cast (e.g. to read an affine calibrator's matrix off exactly, probing it at 0 and the unit vectors)."""
        self.check_fitted()
        arr = check_array(np.atleast_2d(X), n_features=self.n_features_in_, what="X", owner=type(self).__name__)
        return np.asarray(self._transform(arr), dtype=np.float64)

    def torch_transform(self, device: str | torch.device = "cpu") -> TorchTransform:
        """This calibrator's :meth:`transform` as a torch function on ``device``: float32 [n, D] -> [n, D_out], so
        an encoder can calibrate pooled vectors before they leave the GPU. Agrees with :meth:`transform` to float32
        rounding (~1e-6 relative); does not validate its input; holds its own copy of the fitted state."""
        self.check_fitted()
        fn = self._torch_transform(torch.device(device))
        return lambda x: fn(x.to(torch.float32))  # no copy when x is float32 already

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        """Subclasses override with a native torch version; this fallback round-trips through numpy."""

        def via_numpy(x: torch.Tensor) -> torch.Tensor:
            z = self._transform(x.detach().to("cpu", torch.float64).numpy())
            return torch.from_numpy(np.ascontiguousarray(z, dtype=np.float32)).to(x.device)

        return via_numpy

    @property
    def n_features_out_(self) -> int:
        """Dimension of the calibrated vectors."""
        self.check_fitted()
        return self.n_features_in_

    def min_rows(self) -> int:
        """Fewest rows ``fit`` accepts."""
        return 2

    def check_params(self, X: np.ndarray) -> None:
        """Refuse NaN or infinite numeric hyperparameters (range checks like ``x < 0`` are false for NaN), then run
        the subclass's :meth:`_validate_params`."""
        for name, value in self.get_params().items():
            if isinstance(value, (float, np.floating)) and not np.isfinite(value):
                raise InputError(f"{type(self).__name__}: {name} must be a finite number, got {value!r}")
        self._validate_params(X)

    def _validate_params(self, X: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Check hyperparameters against the data at fit time (scikit-learn validates in fit, not init)."""

    @abstractmethod
    def _fit(self, X: np.ndarray) -> None: ...

    @abstractmethod
    def _transform(self, X: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]: ...

    @abstractmethod
    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None: ...

    def to_config(self) -> dict[str, Any]:
        """JSON describing the class, its parameters and fitted scalar state (no arrays)."""
        self.check_fitted()
        meta, _ = self._get_state()
        return {
            "type": self.name,
            "params": self.get_params(),
            "n_features_in": int(self.n_features_in_),
            "state": meta,
            "format_version": FORMAT_VERSION,
            "bertflow_version": __version__,
        }

    def save(self, path: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path`` (created if needed)."""
        self.check_fitted()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        _, arrays = self._get_state()
        save_arrays(folder / WEIGHTS_NAME, arrays)
        write_json(folder / CONFIG_NAME, self.to_config())

    @classmethod
    def from_config(
        cls, config: dict[str, Any], arrays: dict[str, np.ndarray], *, source: str | Path = "calibrator config"
    ) -> Calibrator:
        """Rebuild a fitted calibrator from :meth:`to_config` output and its arrays, validating both (``source``
        names the config in errors): ModelFileError for a missing key, a newer or missing format version, parameters
        or arrays that do not fit; CompatibilityError for an unknown type, or another than the class called on."""
        for key in ("type", "params", "n_features_in", "state", "format_version"):
            if key not in config:
                raise ModelFileError(f"calibrator config lacks {key!r}; the file was edited or is not bertflow's")
        check_format(config, source, kind="calibrator")
        klass = get_calibrator_class(config["type"])
        if cls is not Calibrator and not issubclass(klass, cls):
            raise CompatibilityError(f"the folder holds a {config['type']!r} calibrator, not a {cls.name!r}")
        try:
            obj = klass(**config["params"])
        except TypeError as e:
            raise ModelFileError(f"calibrator parameters do not match {klass.__name__}: {e}") from None
        # Set first so _set_state can check its arrays against the declared dimension.
        obj.n_features_in_ = int(config["n_features_in"])
        try:
            obj._set_state(config["state"], arrays)
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise ModelFileError(
                f"saved {klass.__name__} state is inconsistent ({type(e).__name__}: {e}); "
                "the files were edited or come from different saves"
            ) from None
        return obj

    @classmethod
    def load(cls, path: str | Path) -> Calibrator:
        """Load a calibrator saved with :meth:`save` (the concrete class comes from its config)."""
        folder = Path(path)
        config = read_json(folder / CONFIG_NAME)
        return cls.from_config(config, load_arrays(folder / WEIGHTS_NAME), source=folder / CONFIG_NAME)


def check_latents(calibrator: Calibrator, Z: object) -> np.ndarray:
    """Validate the input of an ``inverse_transform``: finite, ``n_features_out_`` columns, as float64 of the same
    shape ([N, D'], or [D'] for one vector). NaN or Inf would otherwise come back as plausible-looking embeddings."""
    calibrator.check_fitted()
    single = np.ndim(Z) == 1
    Z = np.atleast_2d(Z) if single else Z
    arr = check_array(Z, n_features=calibrator.n_features_out_, what="Z", min_rows=0, owner=type(calibrator).__name__)
    return arr[0] if single else arr


def expect_shape(arrays: dict[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
    """Fetch ``arrays[key]`` and check its shape (used by ``_set_state`` implementations)."""
    if key not in arrays:
        raise KeyError(f"array {key!r} is missing")
    arr = arrays[key]
    if arr.shape != shape:
        raise ValueError(f"array {key!r} has shape {arr.shape}, expected {shape}")
    return arr


def as_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A fitted float64 array as the float32 tensor a torch transform computes with."""
    return torch.as_tensor(np.asarray(array, dtype=np.float32), device=device)


# Settings that change how a calibrator runs or where it came from, not what it computes: left out of its
# fingerprint (at any depth of its config), so that it survives saving, loading, another device and an upgrade.
_RUNTIME_KEYS = frozenset({"bertflow_version", "format_version", "verbose", "device"})


def calibrator_fingerprint(calibrator: Calibrator) -> str:
    """A short hash (16 hex digits) of a fitted calibrator's type, parameters and fitted state (arrays included):
    the same before saving and after loading, on any device and bertflow version (runtime settings left out)."""

    def canonical(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: canonical(v) for k, v in value.items() if k not in _RUNTIME_KEYS}
        if isinstance(value, (list, tuple)):
            return [canonical(v) for v in value]
        return value

    config = calibrator.to_config()
    _, arrays = calibrator.fitted_state()  # the fitted arrays, exactly as save() writes them
    h = hashlib.sha256(json.dumps(canonical(config), sort_keys=True, default=str).encode("utf-8"))
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


def calibrator_identity(calibrator: Calibrator) -> dict[str, Any]:
    """``{"type", "fingerprint", "dim"}`` of a fitted calibrator: what a search index (in ``Embedder.identity()``)
    and a calibrated embedding store record of it, and compare on use."""
    return {
        "type": calibrator.name,
        "fingerprint": calibrator_fingerprint(calibrator),
        "dim": int(calibrator.n_features_out_),
    }
