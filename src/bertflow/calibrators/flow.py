"""FlowCalibrator: BERT-flow. A Glow fitted by maximum likelihood maps embeddings to an isotropic Gaussian.

:class:`FlowTrainer` is how it is fitted, step by step: ``FlowCalibrator.fit`` and distributed fitting
(:func:`bertflow.scale.fit.fit_flow_distributed`) both go through it."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..errors import DivergenceError, InputError
from ..flows import GLOW_PRESETS, Glow
from ..resources import limited_threads
from ..validation import check_epochs
from .base import Calibrator, TorchTransform, as_tensor, check_latents, expect_shape, register
from .simple import floored_std

__all__ = ["FlowCalibrator", "FlowTrainer"]

logger = logging.getLogger(__name__)

#: A dimension whose std is below this fraction of the median std is treated as constant (see below).
DEGENERATE_RTOL = 1e-4


@register("flow")
class FlowCalibrator(Calibrator):
    r"""BERT-flow (Li et al., EMNLP 2020): fit a Glow on embeddings by maximum likelihood; output its latent.

    The architecture defaults to the official code's flow (``preset="code"``: 3 levels x 3 steps, additive
    coupling, channel reversal, coupling width 32); ``preset="paper"`` is the paper's Table 7 variant (2 levels,
    random permutation). Any architectural argument left ``None`` comes from the preset.

    Training follows the official code: AdamW (lr 1e-3 constant, weight decay 0.01), gradient-norm clip 1.0,
    batches of 64 sentences, 1 epoch, shuffled and seeded. The loss is the negative log-likelihood in bits per
    dimension; it becomes *negative* once fitted because the flow models a continuous density, which can
    exceed 1 (a probability mass cannot, which is why a negative "loss" looks odd to some users).

    ActNorm's data-dependent initialisation runs explicitly at the start of ``fit`` on up to
    ``init_samples`` shuffled rows, and is stored, so loading never re-initialises.

    Constant dimensions: real checkpoints have output dimensions that (almost) never vary (std below
    ``1e-4`` x the median std; all-MiniLM-L6-v2 has three). A density on them is degenerate and would dominate
    the likelihood, so they are set aside: the Glow models the other dimensions, and the constant ones are only
    centred and appended after the latent, where they add (almost) nothing to the cosine.

    Args:
        preset: ``"code"`` or ``"paper"``.
        n_levels, depth, hidden_channels, coupling, permutation: override the preset's Glow
            (coupling ``"additive"``/``"affine"``; permutation ``"reverse"``/``"random"``/``"lu"``).
        lr, weight_decay, clip_grad_norm: optimiser settings.
        batch_size: sentences per step.
        epochs: passes over the data (fractional allowed: the paper's NLI setting used 0.15).
        max_steps: if set, the number of steps, overriding ``epochs``.
        validation_fraction: if > 0, hold out this share of rows; their NLL, measured every ``eval_every``
            steps, picks the best step (label-free early stopping) and the parameters of that step are kept.
        eval_every: steps between held-out evaluations.
        init_samples: rows used for ActNorm's data-dependent initialisation.
        min_samples: fewer fitting rows are refused (default 32: below a few dozen rows a density estimate with
            ~150k parameters is meaningless). Lower it only for tests and toy data.
        seed: seeds the Glow's initial weights, the shuffling and the held-out split.
        device: ``"cpu"``, ``"cuda"`` ...; ``None`` picks CUDA when available.
        cuda_graph: on CUDA, capture one training step as a CUDA graph and replay it (same kernels, same
            results, several times faster: a step is hundreds of tiny kernels). ``False`` launches them one by
            one. Ignored on CPU and in distributed fitting.
        verbose: show a progress bar with the running loss.

    Attributes:
        flow_: the fitted :class:`~bertflow.flows.Glow` on the non-constant dimensions.
        passthrough_: [P] indices of the dimensions set aside as constant.
        passthrough_mean_, passthrough_scale_: [P] their mean and (floored) std.
        history_: dict of lists: ``step``, ``train_bpd`` (logged steps), ``val_step``, ``val_bpd``.
        n_steps_: optimiser steps taken; best_step_: the step whose parameters were kept.

    References:
        Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020, arXiv:2011.05864.
    """

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

    # -- configuration -----------------------------------------------------------------------------------

    def glow_config(self, n_features: int) -> dict[str, Any]:
        """The Glow architecture these parameters ask for, on ``n_features`` inputs."""
        if self.preset not in GLOW_PRESETS:
            raise InputError(f"unknown flow preset {self.preset!r}; use one of {', '.join(GLOW_PRESETS)}")
        config = dict(GLOW_PRESETS[self.preset])
        for key in ("n_levels", "depth", "coupling", "permutation"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        config.update(n_features=n_features, hidden_channels=int(self.hidden_channels), seed=int(self.seed))
        return config

    def _min_rows(self) -> int:
        return max(2, int(self.min_samples))

    def _validate_params(self, X: np.ndarray) -> None:
        if X.shape[1] < 2:
            raise InputError(
                f"the flow needs at least 2 features (embedding dimensions); X has {X.shape[1]} feature(s)"
            )
        if not (math.isfinite(self.lr) and self.lr > 0) or self.batch_size < 1:
            raise InputError("lr and batch_size must be positive")
        check_epochs(self.epochs)
        if self.max_steps is not None and self.max_steps < 1:
            raise InputError("max_steps must be at least 1")
        if not 0 <= self.validation_fraction < 0.5:
            raise InputError("validation_fraction must be in [0, 0.5)")

    def _device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    # -- fitting -----------------------------------------------------------------------------------------

    def _fit(self, X: np.ndarray) -> None:
        # X is float32 (``_fit_dtype``): it goes to the device once, and everything else happens there, so a
        # million rows cost one 3 GB copy rather than float64 conversions and column gathers on the host.
        trainer = FlowTrainer(self)
        device = trainer.device
        data = torch.from_numpy(np.ascontiguousarray(X)).to(device)
        active = trainer.prepare(*_column_moments(data), len(X))
        if len(self.passthrough_):
            data = data.index_select(1, torch.as_tensor(active, device=device))
        trainer.build()
        val_rows, train_rows = trainer.split(len(data))
        # Rows are addressed through the shuffled order instead of copying a shuffled training set.
        val_rows, train_rows = val_rows.to(device), train_rows.to(device)
        trainer.initialize(data.index_select(0, train_rows[: self.init_samples]))
        val = data.index_select(0, val_rows)
        trainer.run(
            self._device_batches(data, train_rows, len(train_rows), trainer.generator),
            len(train_rows),
            evaluate=(lambda glow: FlowTrainer.mean_bits_per_dim(glow, val)) if len(val) else None,
        )

    def _batches(self, n: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
        """Endless stream of index batches: shuffled epochs, every batch full (the last one wraps around)."""
        size = min(self.batch_size, n)
        pool = torch.empty(0, dtype=torch.long)
        while True:
            while len(pool) < size:
                pool = torch.cat([pool, torch.randperm(n, generator=gen)])
            yield pool[:size]
            pool = pool[size:]

    def _device_batches(
        self, train: torch.Tensor, rows: torch.Tensor | None, n: int, gen: torch.Generator, steps_per_block: int = 4096
    ) -> Iterator[torch.Tensor]:
        """The batches of :meth:`_batches` (same generator calls, same order), gathered on ``train``'s device.

        The indices of ``steps_per_block`` steps go to the device in one copy (and through ``rows``, the training
        rows of ``train``) instead of one small host-to-device copy per step.
        """
        size = min(self.batch_size, n)
        stream = self._batches(n, gen)
        while True:
            block = torch.cat([next(stream) for _ in range(steps_per_block)]).to(train.device)
            if rows is not None:
                block = rows.index_select(0, block)
            for idx in block.split(size):
                yield train.index_select(0, idx)

    # -- using the fitted flow ---------------------------------------------------------------------------

    @torch.no_grad()
    def _latent(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(z [N, D_active], log|det J| [N]) of the active dimensions, in float64."""
        device = next(self.flow_.parameters()).device
        zs, ladjs = [], []
        for chunk in np.array_split(X[:, self._active], max(1, math.ceil(len(X) / 65536))):
            z, ladj = self.flow_(torch.from_numpy(chunk.astype(np.float32)).to(device))
            zs.append(z.double().cpu().numpy())
            ladjs.append(ladj.double().cpu().numpy())
        return np.concatenate(zs), np.concatenate(ladjs)

    def _transform(self, X: np.ndarray) -> np.ndarray:
        z, _ = self._latent(X)
        return np.concatenate([z, X[:, self.passthrough_] - self.passthrough_mean_], axis=1)

    def _torch_transform(self, device: torch.device) -> TorchTransform:
        import copy

        glow = copy.deepcopy(self.flow_).to(device).eval()
        active = torch.as_tensor(self._active, device=device)
        constant = torch.as_tensor(self.passthrough_, device=device)
        constant_mean = as_tensor(self.passthrough_mean_, device)
        if not len(self.passthrough_):

            @torch.no_grad()
            def latent(x: torch.Tensor) -> torch.Tensor:
                return glow(x)[0]

            return latent

        @torch.no_grad()
        def latent_and_constant(x: torch.Tensor) -> torch.Tensor:
            z, _ = glow(x.index_select(1, active))
            return torch.cat([z, x.index_select(1, constant) - constant_mean], dim=1)

        return latent_and_constant

    def inverse_transform(self, Z: np.ndarray) -> np.ndarray:
        """Map latents [N, D] (as returned by :meth:`transform`) back to embeddings [N, D]."""
        Z = check_latents(self, Z)
        n_active = len(self._active)
        device = next(self.flow_.parameters()).device
        with torch.no_grad():
            x_active, _ = self.flow_.inverse(torch.from_numpy(Z[:, :n_active].astype(np.float32)).to(device))
        out = np.empty((len(Z), self.n_features_in_), dtype=np.float64)
        out[:, self._active] = x_active.double().cpu().numpy()
        out[:, self.passthrough_] = Z[:, n_active:] + self.passthrough_mean_
        return out.astype(np.float32)

    def score_samples(self, X: np.ndarray) -> np.ndarray:
        """Log-density log p(x) in nats per sample [N] (constant dimensions scored by their floored Gaussian)."""
        self._check_fitted()
        from ..validation import check_array

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

    # -- persistence -------------------------------------------------------------------------------------

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
        d = glow.get_config()["n_features"] + len(self.passthrough_)
        if d != self.n_features_in_:
            raise ValueError(f"the flow covers {d} dimensions but the config declares {self.n_features_in_}")
        self._active = np.setdiff1d(np.arange(d), self.passthrough_)
        self.flow_ = glow.to(self._device()).eval()
        self.n_steps_ = int(meta["n_steps"])
        self.best_step_ = int(meta["best_step"])
        self.history_ = meta["history"]


class FlowTrainer:
    """Fits the Glow of one :class:`FlowCalibrator`: the steps that single-process and distributed fitting share.

    :meth:`FlowCalibrator.fit` (rows in memory) and :func:`bertflow.scale.fit.fit_flow_distributed` (rows on
    disk, one share of every batch per rank) both go through these steps, in this order, so the two make the same
    generator calls, the same split and the same batches:

    1. :meth:`prepare` sets the constant dimensions aside, from per-dimension statistics of the fitting rows;
    2. :meth:`build` makes the seeded, untrained Glow on the device; :meth:`split` draws the shuffled held-out and
       training rows from the seeded generator (:attr:`generator`, which then draws the batches:
       :meth:`index_batches`);
    3. :meth:`initialize` runs ActNorm's data-dependent initialisation;
    4. :meth:`run` trains: :meth:`begin`, then :meth:`step` on every batch, :meth:`check` for divergence,
       :meth:`observe` for the held-out score (label-free early stopping), and :meth:`finalise`, which keeps the
       best step's parameters and sets the calibrator's fitted attributes (``flow_``, ``n_steps_``,
       ``best_step_``, ``history_``).

    Args:
        calibrator: the (unfitted) calibrator; its hyperparameters drive the fit and its fitted attributes are set.
        device: where the Glow trains; default ``calibrator.device`` (CUDA when available).
        reduce: called in every step after ``backward`` with this process's loss term (the sum of its rows' bits
            per dimension divided by the global batch size); it must sum the gradients over the processes in place
            and return the global batch loss (:class:`bertflow.scale.fit.GradientAllReduce`). ``None``: one
            process, the loss is the batch mean. Steps with ``reduce`` are never captured as a CUDA graph.
        verbose: show the progress bar; default ``calibrator.verbose``.
    """

    def __init__(
        self,
        calibrator: FlowCalibrator,
        *,
        device: str | torch.device | None = None,
        reduce: Callable[[Glow, torch.Tensor], torch.Tensor] | None = None,
        verbose: bool | None = None,
    ) -> None:
        self.calibrator = calibrator
        self.device = torch.device(device) if device is not None else calibrator._device()
        self.reduce = reduce
        self.verbose = calibrator.verbose if verbose is None else bool(verbose)
        self.generator = torch.Generator().manual_seed(int(calibrator.seed))
        self.glow: Glow | None = None
        # Set by begin(): steps in all, rows per global batch, the optimiser and the divergence guard.
        self.total = 0
        self.size = 0
        self.params: list[torch.nn.Parameter] = []
        self.opt: torch.optim.Optimizer | None = None
        self.guard: _DivergenceGuard | None = None
        self._use_graph = False
        self._graph: _GraphStep | None = None
        self.history: dict[str, list[float]] = {"step": [], "train_bpd": [], "val_step": [], "val_bpd": []}
        self.best: tuple[float, int, dict[str, torch.Tensor] | None] = (math.inf, 0, None)  # (val bpd, step, state)

    # -- before training ---------------------------------------------------------------------------------

    def check_input(self, n_rows: int, n_features: int) -> None:
        """Refuse bad hyperparameters, or too few rows, before any work (``fit`` checks an in-memory matrix itself).

        Raises:
            InputError: a hyperparameter out of range, fewer than 2 features, or fewer rows than ``min_samples``.
        """
        cal = self.calibrator
        cal._check_params(np.empty((0, n_features)))
        if n_rows < cal._min_rows():
            raise InputError(f"the flow needs at least {cal._min_rows()} rows, got {n_rows}")

    def prepare(self, mean: np.ndarray, std: np.ndarray, abs_max: float, n_rows: int) -> np.ndarray:
        """Set the constant dimensions aside from per-dimension statistics of all fitting rows; returns the [D_a]
        indices of the active (modelled) dimensions.

        Args:
            mean: [D] float64 mean of each dimension.
            std: [D] float64 population std (ddof 0) of each dimension.
            abs_max: largest absolute value in the rows (sets the float-rounding floor).
            n_rows: number of fitting rows (for the error message).

        Raises:
            InputError: fewer than 2 dimensions vary.
        """
        cal = self.calibrator
        # Relative to the typical spread, and never below float rounding of the values themselves.
        degenerate = std <= max(DEGENERATE_RTOL * np.median(std), 1e-12 * abs_max)
        cal.passthrough_ = np.flatnonzero(degenerate)
        cal.passthrough_mean_ = mean[degenerate]
        cal.passthrough_scale_ = floored_std(std)[degenerate]
        cal._active = np.flatnonzero(~degenerate)
        if len(cal._active) < 2:
            raise InputError(
                f"only {len(cal._active)} of {len(std)} embedding dimensions vary across the {n_rows} rows "
                "(are all rows duplicates of one another?); a flow needs varied embeddings"
            )
        if len(cal.passthrough_):
            logger.info("flow: %d constant dimension(s) set aside: %s", len(cal.passthrough_), cal.passthrough_)
        return cal._active

    def build(self) -> Glow:
        """The untrained, uninitialised Glow on the active dimensions (after :meth:`prepare`), seeded by ``seed``,
        on :attr:`device`; it is also the calibrator's ``flow_`` from now on."""
        cal = self.calibrator
        try:
            config = cal.glow_config(len(cal._active))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cal.seed)
                glow = Glow(**config)
        except ValueError as e:
            raise InputError(f"cannot build the flow for these embeddings: {e}") from None
        self.glow = cal.flow_ = glow.to(self.device)
        return self.glow

    def split(self, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(held-out rows [round(validation_fraction * n_rows)], training rows [the rest]): indices into the
        fitting rows, in the seeded shuffled order (on the CPU)."""
        order = torch.randperm(n_rows, generator=self.generator)
        n_val = int(round(self.calibrator.validation_fraction * n_rows))
        return order[:n_val], order[n_val:]

    def index_batches(self, n_train: int) -> Iterator[torch.Tensor]:
        """Endless stream of [min(batch_size, n_train)] indices into the training rows (after :meth:`split`):
        shuffled epochs drawn from :attr:`generator`, every batch full."""
        return self.calibrator._batches(n_train, self.generator)

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """ActNorm's data-dependent initialisation on rows ``x`` [n, D_a] (the first ``init_samples`` training
        rows in shuffled order), on :attr:`device`."""
        self._glow().initialize(x)

    # -- training ----------------------------------------------------------------------------------------

    def run(
        self,
        batches: Iterator[torch.Tensor],
        n_train: int,
        *,
        evaluate: Callable[[Glow], float] | None = None,
    ) -> None:
        """Train: :meth:`begin`, a :meth:`step` on each batch, divergence checks, held-out scores, :meth:`finalise`.

        The loop never waits for the device between checks: divergence (a NaN/Inf loss or gradient norm) is
        recorded in a device flag and read every ``_CHECK_EVERY`` steps, when a snapshot of the parameters is also
        taken (one fused copy); on divergence that snapshot is restored.

        Args:
            batches: the rows [b, D_a] of every step, on :attr:`device` (with ``reduce``: this process's share of
                each global batch).
            n_train: training rows (over all processes); with ``epochs`` it sets the number of steps.
            evaluate: held-out mean bits per dimension of the Glow, scored every ``eval_every`` steps; the step
                with the lowest keeps its parameters. ``None``: no held-out rows, the last step is kept.

        Raises:
            DivergenceError: the loss or a gradient became NaN or Inf (the parameters of the last clean check are
                kept, and ``n_steps_`` / ``best_step_`` / ``history_`` say where).
        """
        from tqdm.auto import tqdm

        cal = self.calibrator
        total = self.begin(n_train)
        log_every = max(1, total // 100)
        # The flow's matrices are tiny ([64, D/2] x [D/2, 32]): intra-op threads only add synchronisation, which
        # is ruinous when another process holds a core.
        with (
            limited_threads(torch_threads=1 if self.device.type == "cpu" else None),
            tqdm(range(1, total + 1), desc="fit flow", disable=not self.verbose, unit="step") as bar,
        ):
            for k in bar:
                loss = self.step(next(batches))
                if k % _CHECK_EVERY == 0 or k == total:
                    self.check(k)
                if k % log_every == 0 or k == total:
                    self.history["step"].append(k)
                    self.history["train_bpd"].append(loss.item())
                    bar.set_postfix(bpd=f"{self.history['train_bpd'][-1]:.3f}")
                if evaluate is not None and (k % cal.eval_every == 0 or k == total):
                    self.check(k)  # never keep the state of a diverged step as the best one
                    self.observe(k, evaluate(self._glow()))
        self.finalise()

    def begin(self, n_train: int) -> int:
        """Start the optimiser (after :meth:`initialize`, and after any broadcast of the initialised parameters);
        returns the number of steps for ``n_train`` training rows."""
        cal = self.calibrator
        glow = self._glow()
        self.size = min(cal.batch_size, int(n_train))
        self.total = cal.max_steps or max(1, math.ceil(cal.epochs * n_train / self.size))
        self.params = [p for p in glow.parameters() if p.requires_grad]
        cuda = self.device.type == "cuda"
        # Fused and capturable on CUDA: one kernel for the whole update, step counts kept on the device.
        self.opt = torch.optim.AdamW(
            self.params,
            lr=cal.lr,
            weight_decay=cal.weight_decay,
            **({"fused": True, "capturable": True} if cuda else {}),
        )
        self.guard = _DivergenceGuard(self.params, self.device)
        # A step of this ~150k-parameter flow is several hundred tiny kernels, whose launches, not the arithmetic,
        # set the pace on CUDA: the whole step is captured once and replayed as a CUDA graph.
        self._use_graph = cuda and cal.cuda_graph and self.reduce is None
        self._graph = None
        glow.train()
        return self.total

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """One optimiser step on the batch ``x`` [b, D_a] (after :meth:`begin`); returns its loss (a 0-d device
        tensor, in bits per dimension; with ``reduce``, the global batch's)."""
        if self.opt is None:
            raise RuntimeError("FlowTrainer: call begin() before step()")
        if self._use_graph and self._graph is None:
            self._graph = _GraphStep.capture(self._step, self.params, self.opt, self.guard, x)
            self._use_graph = self._graph is not None
        if self._graph is not None:
            return self._graph(x)
        self.opt.zero_grad(set_to_none=True)
        return self._step(x)

    def _step(self, x: torch.Tensor) -> torch.Tensor:
        glow = self._glow()
        if self.reduce is None:
            loss = glow.bits_per_dim(x).mean()
            loss.backward()
        else:
            # This process's rows summed / global batch size: the gradients summed over the processes are then
            # those of the global batch mean, even when they hold unequal shares of it.
            local = glow.bits_per_dim(x).sum() / self.size
            local.backward()
            loss = self.reduce(glow, local.detach())
        cuda = self.device.type == "cuda"
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.calibrator.clip_grad_norm, foreach=cuda or None)
        self.guard.record(loss.detach(), norm)
        self.opt.step()
        return loss.detach()

    def check(self, k: int) -> None:
        """Read the divergence flag after step ``k`` (waits for the device).

        Raises:
            DivergenceError: a step up to ``k`` had a NaN/Inf loss or gradient norm; the parameters of the last clean
                check were restored and the calibrator's ``n_steps_``, ``best_step_`` and ``history_`` say so.
        """
        bad = self.guard.check(k)
        if bad:
            cal = self.calibrator
            cal.n_steps_, cal.best_step_, cal.history_ = self.guard.kept, self.guard.kept, self.history
            raise DivergenceError(
                f"flow fitting diverged at step {bad} of {self.total}: the loss or its gradient became NaN or Inf; "
                f"the parameters of step {self.guard.kept} were kept. "
                "Try a smaller lr, affine -> additive coupling, or check the embeddings."
            )

    def observe(self, k: int, val_bpd: float) -> None:
        """Record the held-out score of step ``k``; the parameters of the lowest so far are kept (early stopping)."""
        self.history["val_step"].append(k)
        self.history["val_bpd"].append(val_bpd)
        if val_bpd < self.best[0]:
            self.best = (val_bpd, k, {name: v.detach().clone() for name, v in self._glow().state_dict().items()})

    @property
    def best_step(self) -> int:
        """The step whose parameters :meth:`finalise` keeps: the best held-out score's, else the last."""
        return self.best[1] if self.best[2] is not None else self.total

    def finalise(self) -> None:
        """Keep the best step's parameters, put the Glow in eval mode, and set the calibrator's ``flow_``,
        ``n_steps_``, ``best_step_`` and ``history_``."""
        cal, glow = self.calibrator, self._glow()
        if self.best[2] is not None:
            glow.load_state_dict(self.best[2])
            logger.info("flow: kept step %d of %d (held-out bpd %.4f)", self.best[1], self.total, self.best[0])
        cal.flow_ = glow.eval()
        cal.n_steps_, cal.best_step_, cal.history_ = self.total, self.best_step, self.history

    @staticmethod
    @torch.no_grad()
    def mean_bits_per_dim(glow: Glow, x: torch.Tensor) -> float:
        """Mean negative log-likelihood of rows ``x`` [n, D_a] in bits per dimension (in eval mode, in blocks)."""
        was_training = glow.training
        glow.eval()
        value = float(torch.cat([glow.bits_per_dim(c) for c in x.split(65536)]).mean())
        glow.train(was_training)
        return value

    def _glow(self) -> Glow:
        if self.glow is None:
            raise RuntimeError("FlowTrainer: call build() first")
        return self.glow


#: Steps between reads of the divergence flag (each read waits for the device) and parameter snapshots.
_CHECK_EVERY = 100


def _column_moments(x: torch.Tensor, chunk: int = 16384) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-column mean and population std of ``x`` [N, D] in float64 (two passes over blocks of rows, on ``x``'s
    device), and the largest absolute value. Blocks keep the float64 temporaries small."""
    total = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    abs_max = torch.zeros((), dtype=torch.float64, device=x.device)
    for part in x.split(chunk):
        total += part.sum(0, dtype=torch.float64)
        abs_max = torch.maximum(abs_max, part.abs().amax().double())
    mean = total / len(x)
    squares = torch.zeros_like(total)
    for part in x.split(chunk):
        squares += (part.double() - mean).square().sum(0)
    std = (squares / len(x)).sqrt()
    return mean.cpu().numpy(), std.cpu().numpy(), float(abs_max)


class _DivergenceGuard:
    """Notes on the device the first step whose loss or gradient norm is not finite, without waiting for it.

    ``record`` runs inside every step (also inside a CUDA graph: the step counter lives on the device); ``check``
    reads the flag, which waits for the device, so the loop calls it only every ``_CHECK_EVERY`` steps. Each
    clean check snapshots the parameters (one fused copy); a failed one restores the last snapshot.
    """

    def __init__(self, params: list[torch.Tensor], device: torch.device) -> None:
        self.params = [p.detach() for p in params]
        self.snapshot = [p.clone() for p in self.params]
        self.kept = 0  # the step whose parameters the snapshot holds
        self.counter = torch.zeros((), dtype=torch.long, device=device)
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)

    def record(self, loss: torch.Tensor, norm: torch.Tensor) -> None:
        self.counter.add_(1)
        bad = ~(torch.isfinite(loss) & torch.isfinite(norm))
        self.first_bad.copy_(torch.where(bad & (self.first_bad == 0), self.counter, self.first_bad))

    def reset(self) -> None:
        self.counter.zero_()
        self.first_bad.zero_()

    @torch.no_grad()
    def check(self, step: int) -> int:
        """0 if every step up to ``step`` was finite (the snapshot then becomes ``step``'s parameters); otherwise
        the first bad step, after the parameters of step ``kept`` have been restored."""
        bad = int(self.first_bad)
        if bad:
            torch._foreach_copy_(self.params, self.snapshot)
            return bad
        torch._foreach_copy_(self.snapshot, self.params)
        self.kept = step
        return 0


class _GraphStep:
    """One whole training step (forward, backward, clipping, AdamW, divergence flag) captured as a CUDA graph.

    Replaying it costs one launch instead of several hundred. Capture needs a few warm-up steps first (they
    create the gradients and the optimiser state and settle the allocator); they are undone, so training starts
    from the same parameters and optimiser state as without the graph, and replays run the same kernels as the
    eager loop on CUDA, with the same results.
    """

    def __init__(self, graph: torch.cuda.CUDAGraph, static_x: torch.Tensor, static_loss: torch.Tensor) -> None:
        self.graph, self.static_x, self.static_loss = graph, static_x, static_loss

    @classmethod
    def capture(
        cls,
        step: Callable[[torch.Tensor], torch.Tensor],
        params: list[torch.nn.Parameter],
        opt: torch.optim.Optimizer,
        guard: _DivergenceGuard,
        example: torch.Tensor,
        warmup: int = 3,
    ) -> _GraphStep | None:
        """Capture ``step`` on batches shaped like ``example``; ``None`` (eager training) if capture fails."""
        static_x = example.clone()
        start = [p.detach().clone() for p in params]

        @torch.no_grad()
        def undo() -> None:
            torch._foreach_copy_([p.detach() for p in params], start)
            for values in opt.state.values():
                for v in values.values():
                    if torch.is_tensor(v):
                        v.zero_()
            guard.reset()

        try:
            side = torch.cuda.Stream(device=example.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    opt.zero_grad(set_to_none=False)
                    step(static_x)
            torch.cuda.current_stream().wait_stream(side)
            undo()
            graph = torch.cuda.CUDAGraph()
            grads = [p.grad for p in params]
            with torch.cuda.graph(graph):
                torch._foreach_zero_(grads)
                static_loss = step(static_x)
        except RuntimeError as e:  # e.g. an operation that cannot be captured on this torch/driver
            logger.warning("flow: CUDA graph capture failed (%s); training without it", e)
            torch.cuda.synchronize(example.device)
            undo()
            opt.zero_grad(set_to_none=True)
            return None
        undo()  # capture records the step without running it, but be exact about the starting state
        return cls(graph, static_x, static_loss)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Run one step on the batch ``x``; returns the (device) loss of that step."""
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_loss
