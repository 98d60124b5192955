"""Exact distributed fitting: whitening from all-reduced float64 moments (:func:`fit_whitening_distributed`,
exact up to rounding), and the flow with every rank computing its share of each global batch and gradients summed
(:func:`fit_flow_distributed`, the single-process fit up to floating-point summation order).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InputError
from ..resources import share
from .launch import broadcast_object, default_device, rank_and_world

if TYPE_CHECKING:
    from ..calibrators import FlowCalibrator, WhiteningCalibrator


@dataclass
class Moments:
    """Float64 sums over all ranks of ``n`` rows ``x_i`` [D] less ``shift`` (the mean of the ranks' first chunks:
    near the mean, so no digits are lost to cancellation): ``sum`` [D], ``sum_sq`` [D], ``sum_outer`` [D, D] (if
    asked for), and ``abs_max``, the largest ``|x|``."""

    n: int
    shift: np.ndarray
    sum: np.ndarray
    sum_sq: np.ndarray
    sum_outer: np.ndarray | None
    abs_max: float

    @property
    def mean(self) -> np.ndarray:
        return self.shift + self.sum / self.n

    @property
    def std(self) -> np.ndarray:
        """[D] population std (ddof 0), as ``np.std``."""
        d = self.sum / self.n
        return np.sqrt(np.maximum(self.sum_sq - self.n * d * d, 0.0) / self.n)


def all_reduce_moments(
    chunks: Iterable[np.ndarray], dim: int, *, outer: bool = True, device: str | None = None
) -> Moments:
    """Sum float64 moments of this rank's ``chunks`` ([n_i, D] blocks; a rank may have none) and all-reduce them
    over the job (exact, order aside). Call on every rank. ``outer`` also sums outer products (whitening needs
    them); ``device`` accumulates there (CUDA makes the D x D products cheap). InputError: no rows on any rank,
    wrong width, or NaN / Inf."""
    dev = torch.device(device or "cpu")
    blocks = (_checked_block(block, dim) for block in chunks)
    first = next(blocks, None)
    seed = torch.zeros(dim + 1, dtype=torch.float64, device=dev)
    if first is not None:
        seed[0] = len(first)
        seed[1:] = torch.from_numpy(first.astype(np.float64).sum(axis=0)).to(dev)
    _all_reduce(seed)
    if seed[0] == 0:
        raise InputError("no rows to compute statistics from, on any rank")
    shift = seed[1:] / seed[0]
    # One vector, all-reduced at once: n, the sum [D], the sum of squares [D], the outer products [D * D].
    flat = torch.zeros(1 + 2 * dim + (dim * dim if outer else 0), dtype=torch.float64, device=dev)
    abs_max = 0.0
    for block in itertools.chain([first] if first is not None else [], blocks):
        if not len(block):
            continue
        c = torch.from_numpy(block.astype(np.float64, copy=False)).to(dev) - shift
        flat[0] += len(block)
        flat[1 : dim + 1] += c.sum(dim=0)
        flat[dim + 1 : 2 * dim + 1] += (c * c).sum(dim=0)
        if outer:
            flat[2 * dim + 1 :] += (c.T @ c).reshape(-1)
        abs_max = max(abs_max, float(np.abs(block).max()))
    largest = torch.tensor([abs_max], dtype=torch.float64, device=dev)
    _all_reduce(flat)
    _all_reduce(largest, dist.ReduceOp.MAX if dist.is_available() else None)
    flat = flat.cpu().numpy()
    return Moments(
        n=int(round(flat[0])),
        shift=shift.cpu().numpy(),
        sum=flat[1 : dim + 1],
        sum_sq=flat[dim + 1 : 2 * dim + 1],
        sum_outer=flat[2 * dim + 1 :].reshape(dim, dim) if outer else None,
        abs_max=float(largest.item()),
    )


def _checked_block(block: Any, dim: int) -> np.ndarray:
    block = np.asarray(block)
    if block.ndim != 2 or block.shape[1] != dim:
        raise InputError(f"expected rows of shape [n, {dim}], got {block.shape}")
    if not np.isfinite(block).all():
        raise InputError("the embeddings contain NaN or Inf; the model or its input is broken")
    return block


def _all_reduce(tensor: torch.Tensor, op: Any = None) -> None:
    if rank_and_world()[1] > 1:
        dist.all_reduce(tensor, op=op if op is not None else dist.ReduceOp.SUM)


def _share_chunks(X: Any, rows: int) -> Iterator[np.ndarray]:
    """This rank's share of the rows of an array-like (ndarray, memmap, ShardedEmbeddings) in blocks of ``rows``."""
    start, stop = share(int(X.shape[0]), *rank_and_world())
    for a in range(start, stop, rows):
        yield np.asarray(X[a : min(a + rows, stop)])


def _check_matrix(X: Any) -> tuple[int, int]:
    shape = getattr(X, "shape", None)
    if shape is None or len(shape) != 2:
        raise InputError(f"expected an [N, D] array-like (ndarray, memmap, store), got {type(X).__name__}")
    return int(shape[0]), int(shape[1])


def fit_whitening_distributed(
    X: Any,
    calibrator: WhiteningCalibrator | None = None,
    *,
    chunk_rows: int = 65536,
    device: str | None = None,
) -> WhiteningCalibrator:
    """Fit whitening on [N, D] rows ``X`` readable by every rank (a store on shared storage, a memory-mapped
    ``.npy``); every rank returns the same fitted ``calibrator`` (default: keep all).

    Each rank streams its share in blocks of ``chunk_rows``; the all-reduced float64 moments give the exact mean
    and covariance, so the result equals ``WhiteningCalibrator().fit(np.asarray(X))`` up to rounding (about 1e-13
    relative on real embeddings). For rows only this rank holds: :func:`all_reduce_moments` + ``fit_from_moments``.
    """
    from ..calibrators import WhiteningCalibrator

    cal = calibrator if calibrator is not None else WhiteningCalibrator()
    _, d = _check_matrix(X)
    moments = all_reduce_moments(_share_chunks(X, chunk_rows), d, outer=True, device=device)
    return cal.fit_from_moments(moments.n, moments.sum, moments.sum_outer, shift=moments.shift)


def all_reduce_gradients(glow: torch.nn.Module, local_loss: torch.Tensor) -> torch.Tensor:
    """The ``reduce`` hook of :class:`~bertflow.calibrators.flow_trainer.FlowTrainer`: one all-reduce per step of a
    flat vector of every gradient and the loss term, in place, so every rank takes the identical step (no drift);
    returns the global batch loss (a 0-d tensor)."""
    params = [p for p in glow.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [local_loss.reshape(1).to(grads[0].dtype)])
    _all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat[-1]


class _HeldOutScore:
    """Mean bits per dimension of the held-out rows, each rank scoring its share and the sums all-reduced."""

    def __init__(self, X: Any, rows: np.ndarray, active: np.ndarray, total: int, device: torch.device) -> None:
        self.X, self.rows, self.active, self.total, self.device = X, np.sort(rows), active, total, device
        # Hold the share in memory when it is small (the usual case); stream it from disk otherwise.
        small = len(self.rows) * len(active) * 4 <= 512 * 2**20
        self._cache = self._read(self.rows) if small else None

    def _read(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.X[rows])[:, self.active].astype(np.float32)).to(self.device)

    @torch.no_grad()
    def __call__(self, glow: torch.nn.Module) -> float:
        was_training = glow.training
        glow.eval()
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        blocks = (
            [self._cache]
            if self._cache is not None
            else (self._read(r) for r in np.array_split(self.rows, max(1, len(self.rows) // 65536)))
        )
        for block in blocks:
            for part in block.split(65536):
                total += glow.bits_per_dim(part).double().sum()
        glow.train(was_training)
        _all_reduce(total)
        return float(total.item() / self.total)


def fit_flow_distributed(
    X: Any,
    calibrator: FlowCalibrator | None = None,
    *,
    device: str | None = None,
    chunk_rows: int = 65536,
    read_steps: int = 256,
) -> FlowCalibrator:
    """Fit BERT-flow on [N, D] rows ``X`` readable by every rank (data parallel); every rank returns the same
    fitted ``calibrator`` (default: the code preset), on ``device`` (default its own, or ``cuda:{local_rank}``).

    ``FlowCalibrator.fit`` step for step, through the same :class:`~bertflow.calibrators.flow_trainer.FlowTrainer`:
    constant dimensions from all-reduced moments (blocks of ``chunk_rows``); split and batches from the seeded
    generator on every rank; ActNorm initialised on rank 0 and broadcast; each rank computes its share of every
    global batch and gradients are summed, so the effective batch is ``batch_size`` whatever the ranks, and the
    result equals one process's up to summation order (~1e-6 relative in the latents). Rows are read at random
    positions, ``read_steps`` steps at a time in row order; memory per rank is 8 bytes a row plus those steps.
    """
    from ..calibrators.flow import FlowCalibrator
    from ..calibrators.flow_trainer import FlowTrainer

    cal = calibrator if calibrator is not None else FlowCalibrator()
    n, d = _check_matrix(X)
    rank, world = rank_and_world()
    dev = torch.device(device or cal.device or default_device())
    trainer = FlowTrainer(cal, device=dev, reduce=all_reduce_gradients, verbose=cal.verbose and rank == 0)
    trainer.check_input(n, d)
    if min(cal.batch_size, n) < world:
        raise InputError(f"batch_size ({cal.batch_size}) must be at least the number of ranks ({world})")
    moments = all_reduce_moments(_share_chunks(X, chunk_rows), d, outer=False)
    active = trainer.prepare(moments.mean, moments.std, moments.abs_max, n)
    glow = trainer.build()
    # The trainer's seeded generator draws the split and every batch, as in one process.
    val_rows, train_rows = (rows.numpy() for rows in trainer.split(n))
    if rank == 0:
        init = np.asarray(X[train_rows[: cal.init_samples]])[:, active].astype(np.float32)
        trainer.initialize(torch.from_numpy(init).to(dev))
    if world > 1:
        state = broadcast_object({k: v.cpu() for k, v in glow.state_dict().items()} if rank == 0 else None)
        glow.load_state_dict(state)
    index_batches = trainer.index_batches(len(train_rows))

    def rank_batches() -> Iterator[torch.Tensor]:
        """This rank's rows of each global batch, read from ``X`` ``read_steps`` steps at a time in row order."""
        while True:
            block = [next(index_batches).numpy() for _ in range(read_steps)]
            # Contiguous split of each global batch: shares differ by at most one row.
            local = [np.array_split(train_rows[idx], world)[rank] for idx in block]
            unique, inverse = np.unique(np.concatenate(local), return_inverse=True)
            data = np.asarray(X[unique])[:, active].astype(np.float32)
            pos = 0
            for part in local:
                yield torch.from_numpy(data[inverse[pos : pos + len(part)]]).to(dev)
                pos += len(part)

    evaluate = None
    if len(val_rows):
        vlo, vhi = share(len(val_rows), rank, world)
        evaluate = _HeldOutScore(X, np.sort(val_rows)[vlo:vhi], active, len(val_rows), dev)
    return cal.fit_from_result(trainer.run(rank_batches(), len(train_rows), evaluate=evaluate), d)
