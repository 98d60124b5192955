"""FlowCalibrator: BERT-flow. A Glow fitted by maximum likelihood maps embeddings to an isotropic Gaussian."""

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

__all__ = ["FlowCalibrator"]

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
        device = self._device()
        data = torch.from_numpy(np.ascontiguousarray(X)).to(device)
        mean, std, abs_max = _column_moments(data)
        self._set_passthrough(mean, std, abs_max, len(X))
        if len(self.passthrough_):
            data = data.index_select(1, torch.as_tensor(self._active, device=device))
        glow = self._build_glow(len(self._active)).to(device)
        gen = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(data), generator=gen)
        n_val = int(round(self.validation_fraction * len(data)))
        # Rows are addressed through the shuffled order instead of copying a shuffled training set.
        val_rows, train_rows = order[:n_val].to(device), order[n_val:].to(device)
        with torch.no_grad():
            glow.initialize(data.index_select(0, train_rows[: self.init_samples]))
        self.flow_ = glow
        # The flow's matrices are tiny ([64, D/2] x [D/2, 32]): intra-op threads only add synchronisation, which is
        # ruinous when another process holds a core.
        with limited_threads(torch_threads=1 if device.type == "cpu" else None):
            self._train(glow, data, data.index_select(0, val_rows), gen, rows=train_rows)
        self.flow_.eval()

    def _set_passthrough(self, mean: np.ndarray, std: np.ndarray, abs_max: float, n_rows: int) -> None:
        """Set the constant-dimension attributes from per-dimension statistics of the fitting embeddings.

        A separate step so that distributed fitting (:mod:`bertflow.scale.fit`) can feed statistics that were
        all-reduced across ranks instead of computed from one in-memory matrix.

        Args:
            mean: [D] float64 mean of each dimension.
            std: [D] float64 population std (ddof 0) of each dimension.
            abs_max: largest absolute value in the embeddings (sets the float-rounding floor).
            n_rows: number of fitting rows (for the error message).
        """
        # Relative to the typical spread, and never below float rounding of the values themselves.
        degenerate = std <= max(DEGENERATE_RTOL * np.median(std), 1e-12 * abs_max)
        self.passthrough_ = np.flatnonzero(degenerate)
        self.passthrough_mean_ = mean[degenerate]
        self.passthrough_scale_ = floored_std(std)[degenerate]
        self._active = np.flatnonzero(~degenerate)
        if len(self._active) < 2:
            raise InputError(
                f"only {len(self._active)} of {len(std)} embedding dimensions vary across the {n_rows} rows "
                "(are all rows duplicates of one another?); a flow needs varied embeddings"
            )
        if len(self.passthrough_):
            logger.info("flow: %d constant dimension(s) set aside: %s", len(self.passthrough_), self.passthrough_)

    def _build_glow(self, n_active: int) -> Glow:
        """The untrained, uninitialised Glow on ``n_active`` dimensions (on the CPU), seeded by ``seed``."""
        try:
            config = self.glow_config(n_active)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                return Glow(**config)
        except ValueError as e:
            raise InputError(f"cannot build the flow for these embeddings: {e}") from None

    def _batches(self, n: int, gen: torch.Generator):
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

    def _train(
        self,
        glow: Glow,
        train: torch.Tensor | None,
        val: torch.Tensor | None,
        gen: torch.Generator,
        *,
        rows: torch.Tensor | None = None,
        batches: Iterator[torch.Tensor] | None = None,
        n_train: int | None = None,
        reduce: Callable[[Glow, torch.Tensor], torch.Tensor] | None = None,
        evaluate: Callable[[Glow], float] | None = None,
    ) -> None:
        """Run the optimiser on the training rows in shuffled batches; ``val`` [M, D] picks the best step.

        The loop never waits for the device between checks: divergence (a NaN/Inf loss or gradient norm) is
        recorded in a device flag and read every ``_CHECK_EVERY`` steps, when a snapshot of the parameters is
        also taken (one fused copy); on divergence that snapshot is restored. On CUDA the whole step is replayed
        as a CUDA graph (``cuda_graph``): a step of this ~150k-parameter flow is several hundred tiny kernels,
        whose launches, not the arithmetic, set the pace.

        The keyword arguments are the hooks of :func:`bertflow.scale.fit.fit_flow_distributed`; left at
        ``None``, this is the single-process loop.

        Args:
            train: [N, D] rows on the device; with ``rows``, the training rows are ``train[rows]``.
            rows: [n] indices of the training rows in ``train`` (on its device), in shuffled order.
            batches: the rows of every step in place of ``train[rows[idx]]``: this rank's share of each global
                batch.
            n_train: training rows over all ranks (needed when ``train`` is ``None``).
            reduce: called after ``backward`` with this rank's loss term (the sum of its rows' bits per dimension
                divided by the global batch size); all-reduces the gradients in place and returns the global
                batch loss.
            evaluate: held-out mean bits per dimension of ``glow``, in place of the mean over ``val``.
        """
        from tqdm.auto import tqdm

        if n_train is not None:
            n = int(n_train)
        else:
            n = len(rows) if rows is not None else len(train)
        size = min(self.batch_size, n)
        total = self.max_steps or max(1, math.ceil(self.epochs * n / size))
        has_val = evaluate is not None or (val is not None and len(val) > 0)
        if evaluate is None and has_val:
            evaluate = lambda g: self._mean_bpd(g, val)  # noqa: E731 - the single-process held-out score
        if batches is None:
            batches = self._device_batches(train, rows, n, gen)
        device = next(glow.parameters()).device
        params = [p for p in glow.parameters() if p.requires_grad]
        cuda = device.type == "cuda"
        # Fused and capturable on CUDA: one kernel for the whole update, step counts kept on the device.
        opt = torch.optim.AdamW(
            params, lr=self.lr, weight_decay=self.weight_decay, **({"fused": True, "capturable": True} if cuda else {})
        )
        guard = _DivergenceGuard(params, device)

        def step(x: torch.Tensor) -> torch.Tensor:
            if reduce is None:
                loss = glow.bits_per_dim(x).mean()
                loss.backward()
            else:
                # This rank's rows summed / global batch size: the gradients summed over the ranks are then
                # those of the global batch mean, even when the ranks hold unequal shares of it.
                local = glow.bits_per_dim(x).sum() / size
                local.backward()
                loss = reduce(glow, local.detach())
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm, foreach=cuda or None)
            guard.record(loss.detach(), norm)
            opt.step()
            return loss.detach()

        use_graph = cuda and self.cuda_graph and reduce is None
        runner: _GraphStep | None = None
        history: dict[str, list[float]] = {"step": [], "train_bpd": [], "val_step": [], "val_bpd": []}
        best = (math.inf, 0, None)  # (val bpd, step, state)
        log_every = max(1, total // 100)

        def check(k: int) -> None:
            bad = guard.check(k)
            if bad:
                self.n_steps_, self.best_step_, self.history_ = guard.kept, guard.kept, history
                raise DivergenceError(
                    f"flow fitting diverged at step {bad} of {total}: the loss or its gradient became NaN or Inf; "
                    f"the parameters of step {guard.kept} were kept. "
                    "Try a smaller lr, affine -> additive coupling, or check the embeddings."
                )

        glow.train()
        with tqdm(range(1, total + 1), desc="fit flow", disable=not self.verbose, unit="step") as bar:
            for k in bar:
                x = next(batches)
                if use_graph and runner is None:
                    runner = _GraphStep.capture(step, params, opt, guard, x)
                    use_graph = runner is not None
                if runner is not None:
                    loss = runner(x)
                else:
                    opt.zero_grad(set_to_none=True)
                    loss = step(x)
                if k % _CHECK_EVERY == 0 or k == total:
                    check(k)
                if k % log_every == 0 or k == total:
                    history["step"].append(k)
                    history["train_bpd"].append(loss.item())
                    bar.set_postfix(bpd=f"{history['train_bpd'][-1]:.3f}")
                if has_val and (k % self.eval_every == 0 or k == total):
                    check(k)  # never keep the state of a diverged step as the best one
                    vbpd = evaluate(glow)
                    history["val_step"].append(k)
                    history["val_bpd"].append(vbpd)
                    if vbpd < best[0]:
                        best = (vbpd, k, {name: v.detach().clone() for name, v in glow.state_dict().items()})
        self.n_steps_ = total
        self.best_step_ = total
        if best[2] is not None:
            glow.load_state_dict(best[2])
            self.best_step_ = best[1]
            logger.info("flow: kept step %d of %d (held-out bpd %.4f)", best[1], total, best[0])
        self.history_ = history

    @staticmethod
    @torch.no_grad()
    def _mean_bpd(glow: Glow, x: torch.Tensor) -> float:
        was_training = glow.training
        glow.eval()
        value = float(torch.cat([glow.bits_per_dim(c) for c in x.split(65536)]).mean())
        glow.train(was_training)
        return value

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
