"""FlowCalibrator: BERT-flow. A Glow fitted by maximum likelihood maps embeddings to an isotropic Gaussian.

It is fitted by :class:`~bertflow.calibrators.flow_trainer.FlowTrainer`, step by step: ``FlowCalibrator.fit`` and
distributed fitting (:func:`bertflow.scale.fit.fit_flow_distributed`) both go through it, and the calibrator assigns
its fitted state from the trainer's :class:`~bertflow.calibrators.flow_trainer.FlowFit`."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np
import torch

from ..errors import DivergenceError, InputError
from ..flows import GLOW_PRESETS, Glow
from ..typing import TorchTransform
from ..validation import check_array, check_epochs
from .base import Calibrator, as_tensor, check_latents, expect_shape
from .flow_trainer import FlowFit, FlowTrainer, column_moments
from .registry import register


@register("flow")
class FlowCalibrator(Calibrator):
    r"""BERT-flow (Li et al., EMNLP 2020): fit a Glow on embeddings by maximum likelihood; output its latent.

    The architecture defaults to the official code's flow (``preset="code"``: 3 levels x 3 steps, additive
    coupling, channel reversal); ``preset="paper"`` is the paper's Table 7 variant (2 levels, random permutation).
    Architectural arguments left ``None`` come from the preset. Training follows the official code: AdamW with a
    constant lr, gradient-norm clipping, shuffled seeded batches; the loss, in bits per dimension, turns *negative*
    once fitted (a continuous density can exceed 1). ActNorm is initialised at the start of ``fit`` on up to
    ``init_samples`` shuffled rows, and stored, so loading never re-initialises. Constant dimensions (std below
    ``1e-4`` x the median; all-MiniLM-L6-v2 has three) would dominate the likelihood: they are set aside, only
    centred and appended after the latent.

    Args:
        n_levels, depth, hidden_channels, coupling, permutation: override the preset's Glow
            (coupling ``"additive"``/``"affine"``; permutation ``"reverse"``/``"random"``/``"lu"``).
        epochs: passes over the data (fractional allowed: the paper's NLI setting used 0.15); ``max_steps``, if
            set, overrides it.
        validation_fraction: if > 0, hold out this share of rows; their NLL, measured every ``eval_every``
            steps, picks the step whose parameters are kept (label-free early stopping).
        min_samples: fewer fitting rows are refused (a density with ~150k parameters on fewer is meaningless).
        seed: seeds the Glow's initial weights, the shuffling and the held-out split.
        device: ``None`` picks CUDA when available.
        cuda_graph: on CUDA, replay one training step as a CUDA graph (same results, several times faster: a
            step is hundreds of tiny kernels). Ignored on CPU and in distributed fitting.
        verbose: show a progress bar with the running loss.

    Attributes:
        flow_: the fitted :class:`~bertflow.flows.Glow` on the non-constant dimensions.
        passthrough_: [P] indices of the dimensions set aside as constant; passthrough_mean_, passthrough_scale_:
            [P] their mean and (floored) std; active_: [D_a] indices of the dimensions the flow models.
        history_: dict of lists: ``step``, ``train_bpd`` (logged steps), ``val_step``, ``val_bpd``.
        n_steps_: optimiser steps taken; best_step_: the step whose parameters were kept.

    References:
        Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020, arXiv:2011.05864.
    """

    rescales_variance = True
    specs = {
        "flow": "BERT-flow, the official code's Glow (3 levels x 3 steps, additive, reverse)",
        "flow-paper": "BERT-flow, the paper's Glow (2 levels x 3 steps, additive, random permutation)",
    }

    _fit_dtype = np.float32  # the flow trains in float32; a float64 copy of a large corpus would only cost memory

    def __init__(
        self,
        preset: str = "code",
        *,
        n_levels: int | None = None,
        depth: int | None = None,
        hidden_channels: int = 32,
        coupling: str | None = None,
        permutation: str | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        clip_grad_norm: float = 1.0,
        batch_size: int = 64,
        epochs: float = 1.0,
        max_steps: int | None = None,
        validation_fraction: float = 0.0,
        eval_every: int = 50,
        init_samples: int = 4096,
        min_samples: int = 32,
        seed: int = 0,
        device: str | None = None,
        cuda_graph: bool = True,
        verbose: bool = False,
    ) -> None:
        self.preset = preset
        self.n_levels = n_levels
        self.depth = depth
        self.hidden_channels = hidden_channels
        self.coupling = coupling
        self.permutation = permutation
        self.lr = lr
        self.weight_decay = weight_decay
        self.clip_grad_norm = clip_grad_norm
        self.batch_size = batch_size
        self.epochs = epochs
        self.max_steps = max_steps
        self.validation_fraction = validation_fraction
        self.eval_every = eval_every
        self.init_samples = init_samples
        self.min_samples = min_samples
        self.seed = seed
        self.device = device
        self.cuda_graph = cuda_graph
        self.verbose = verbose

    @classmethod
    def from_spec(cls, spec: str, number: int | None, **options: Any) -> FlowCalibrator:
        """``flow`` (the code preset) or ``flow-paper``; ``options`` are constructor arguments (``seed`` ...)."""
        return cls("paper" if spec == "flow-paper" else "code", **options)

    def min_rows(self) -> int:
        return max(2, int(self.min_samples))

    def _validate_params(self, X: np.ndarray) -> None:
        if X.shape[1] < 2:
            raise InputError(
                f"the flow needs at least 2 features (embedding dimensions); X has {X.shape[1]} feature(s)"
            )
        if not self.lr > 0 or self.batch_size < 1:  # NaN fails too; check_params refuses inf
            raise InputError("lr and batch_size must be positive")
        check_epochs(self.epochs)
        if self.max_steps is not None and self.max_steps < 1:
            raise InputError("max_steps must be at least 1")
        if not 0 <= self.validation_fraction < 0.5:
            raise InputError("validation_fraction must be in [0, 0.5)")
        if self.preset not in GLOW_PRESETS:
            raise InputError(f"unknown flow preset {self.preset!r}; use one of {', '.join(GLOW_PRESETS)}")

    def resolve_device(self) -> torch.device:
        """The device ``fit`` trains on: ``device``, else CUDA where there is one, else the CPU."""
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def _fit(self, X: np.ndarray) -> None:
        # X is float32 (``_fit_dtype``): it goes to the device once, and everything else happens there, so a
        # million rows cost one 3 GB copy rather than float64 conversions and column gathers on the host.
        trainer = FlowTrainer(self)
        device = trainer.device
        data = torch.from_numpy(np.ascontiguousarray(X)).to(device)
        active = trainer.prepare(*column_moments(data), len(X))
        if len(trainer.passthrough):
            data = data.index_select(1, torch.as_tensor(active, device=device))
        trainer.build()
        # Rows are addressed through the shuffled order instead of copying a shuffled training set.
        val_rows, train_rows = (rows.to(device) for rows in trainer.split(len(data)))
        trainer.initialize(data.index_select(0, train_rows[: self.init_samples]))
        val = data.index_select(0, val_rows)
        try:
            result = trainer.run(
                trainer.row_batches(data, train_rows),
                len(train_rows),
                evaluate=(lambda glow: FlowTrainer.mean_bits_per_dim(glow, val)) if len(val) else None,
            )
        except DivergenceError as e:
            # Keep what the trainer kept, for inspection; fit() then leaves no fitted marker (n_features_in_).
            self._assign(e.result)
            raise
        self._assign(result)

    def fit_from_result(self, result: FlowFit, n_features: int) -> FlowCalibrator:
        """Fit from the :class:`~bertflow.calibrators.flow_trainer.FlowFit` a :class:`FlowTrainer` of this
        calibrator produced on rows of width ``n_features`` (distributed fitting); returns ``self``. InputError if
        the result does not cover ``n_features`` dimensions."""
        covered = len(result.active) + len(result.passthrough)
        if covered != int(n_features):
            raise InputError(f"the flow result covers {covered} dimensions, not the {n_features} given")
        self._reset_fitted()
        self._assign(result)
        self.n_features_in_ = int(n_features)
        return self

    def _assign(self, result: FlowFit) -> None:
        """Set the fitted attributes from the trainer's result (the only place they are set after a fit): each
        field of :class:`FlowFit`, with a trailing ``_``."""
        for field in dataclasses.fields(result):
            setattr(self, f"{field.name}_", getattr(result, field.name))

    @torch.no_grad()
    def _latent(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(z [N, D_active], log|det J| [N]) of the active dimensions, in float64."""
        device = next(self.flow_.parameters()).device
        zs, ladjs = [], []
        for chunk in np.array_split(X[:, self.active_], max(1, math.ceil(len(X) / 65536))):
            z, ladj = self.flow_(torch.from_numpy(chunk.astype(np.float32)).to(device))
            zs.append(z.double().cpu().numpy())
            ladjs.append(ladj.double().cpu().numpy())
        return np.concatenate(zs), np.concatenate(ladjs)

    def _transform(self, X: np.ndarray) -> np.ndarray:
        z, _ = self._latent(X)
        return np.concatenate([z, X[:, self.passthrough_] - self.passthrough_mean_], axis=1)

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        glow = copy.deepcopy(self.flow_).to(device).eval()
        active = torch.as_tensor(self.active_, device=device)
        constant = torch.as_tensor(self.passthrough_, device=device)
        constant_mean = as_tensor(self.passthrough_mean_, device)

        @torch.no_grad()
        def latent(x: torch.Tensor) -> torch.Tensor:
            if not len(constant):
                return glow(x)[0]
            z, _ = glow(x.index_select(1, active))
            return torch.cat([z, x.index_select(1, constant) - constant_mean], dim=1)

        return latent

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Map latents [N, D] (as returned by :meth:`transform`) back to embeddings [N, D]."""
        Z = check_latents(self, Z)
        n_active = len(self.active_)
        device = next(self.flow_.parameters()).device
        with torch.no_grad():
            x_active, _ = self.flow_.inverse(torch.from_numpy(Z[:, :n_active].astype(np.float32)).to(device))
        out = np.empty((len(Z), self.n_features_in_), dtype=np.float64)
        out[:, self.active_] = x_active.double().cpu().numpy()
        out[:, self.passthrough_] = Z[:, n_active:] + self.passthrough_mean_
        return out.astype(np.float32)

    def score_samples(self, X: np.ndarray) -> np.ndarray:
        """Log-density log p(x) in nats per sample [N] (constant dimensions scored by their floored Gaussian)."""
        self.check_fitted()
        X = check_array(X, n_features=self.n_features_in_, owner=type(self).__name__)
        z, ladj = self._latent(X)
        log_p = -0.5 * (z**2).sum(axis=1) - 0.5 * z.shape[1] * math.log(2 * math.pi) + ladj
        u = (X[:, self.passthrough_] - self.passthrough_mean_) / self.passthrough_scale_
        log_p += (-0.5 * u**2 - np.log(self.passthrough_scale_) - 0.5 * math.log(2 * math.pi)).sum(axis=1)
        return log_p

    def score(self, X: np.ndarray, y: object = None) -> float:
        """Mean log-likelihood per sample, in nats."""
        return float(self.score_samples(X).mean())

    def bits_per_dim(self, X: np.ndarray) -> float:
        """Mean negative log-likelihood in bits per dimension (the training objective's unit)."""
        return -self.score(X) / (self.n_features_in_ * math.log(2))

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays = {f"flow.{k}": v.detach().cpu().numpy() for k, v in self.flow_.state_dict().items()}
        arrays.update(
            passthrough=self.passthrough_.astype(np.int64),
            passthrough_mean=self.passthrough_mean_,
            passthrough_scale=self.passthrough_scale_,
        )
        meta = {
            "glow": self.flow_.get_config(),
            "n_steps": int(self.n_steps_),
            "best_step": int(self.best_step_),
            "history": self.history_,
        }
        return meta, arrays

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        glow = Glow(**meta["glow"])
        state = {k[5:]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("flow.")}
        glow.load_state_dict(state, strict=True)
        if not glow.is_initialized:
            raise ValueError("the saved flow was never initialised")
        self.passthrough_ = arrays["passthrough"].astype(np.int64)
        p = (len(self.passthrough_),)
        self.passthrough_mean_ = expect_shape(arrays, "passthrough_mean", p).astype(np.float64)
        self.passthrough_scale_ = expect_shape(arrays, "passthrough_scale", p).astype(np.float64)
        d = glow.n_features + len(self.passthrough_)
        if d != self.n_features_in_:
            raise ValueError(f"the flow covers {d} dimensions but the config declares {self.n_features_in_}")
        self.active_ = np.setdiff1d(np.arange(d), self.passthrough_)
        self.flow_ = glow.to(self.resolve_device()).eval()
        self.n_steps_ = int(meta["n_steps"])
        self.best_step_ = int(meta["best_step"])
        self.history_ = meta["history"]
