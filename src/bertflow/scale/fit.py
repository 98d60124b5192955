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


# -- distributed fitting -------------------------------------------------------------------------------------------


@dataclass
class Moments:
    """Sufficient statistics of rows ``x_i`` [D] shifted by a common reference point, summed over all ranks.

    Attributes:
        n: number of rows.
        shift: [D] the reference point ``s`` (the mean of the ranks' first chunks: near the mean, so the sums
            below lose no digits to cancellation).
        sum: [D] float64 sum of ``x_i - s``.
        sum_sq: [D] float64 sum of ``(x_i - s)**2``.
        sum_outer: [D, D] float64 sum of ``(x_i - s)(x_i - s)^T``, if asked for.
        abs_max: largest ``|x|`` over all rows.
    """

    n: int
    shift: np.ndarray
    sum: np.ndarray
    sum_sq: np.ndarray
    sum_outer: np.ndarray | None
    abs_max: float

    @property
    def mean(self) -> np.ndarray:
        """[D] mean of the rows."""
        return self.shift + self.sum / self.n

    def var(self, ddof: int = 0) -> np.ndarray:
        """[D] per-dimension variance (``ddof=0``: population)."""
        d = self.sum / self.n
        return np.maximum(self.sum_sq - self.n * d * d, 0.0) / (self.n - ddof)

    @property
    def std(self) -> np.ndarray:
        """[D] population std (ddof 0), as ``np.std``."""
        return np.sqrt(self.var(0))


def all_reduce_moments(
    chunks: Iterable[np.ndarray], dim: int, *, outer: bool = True, device: str | None = None
) -> Moments:
    """Sum float64 moments of this rank's rows and all-reduce them over the job (exact, order aside).

    Call on every rank, each with its own rows (a rank may have none). Two small collectives fix the shift;
    one all-reduce (of ``2 D + 1`` numbers, plus ``D^2`` with ``outer``) sums the statistics; one more takes the
    max of ``|x|``.

    Args:
        chunks: this rank's rows, as [n_i, D] blocks (memory stays at one block).
        dim: D (needed by ranks without rows).
        outer: also sum outer products (whitening needs them; the flow only the diagonal).
        device: where to accumulate (a CUDA device makes the D x D products of large corpora cheap); default CPU.

    Raises:
        InputError: no rows on any rank, wrong width, or NaN / Inf in the rows.
    """
    dev = torch.device(device or "cpu")
    iterator = iter(chunks)
    first = next(iterator, None)
    seed = torch.zeros(dim + 1, dtype=torch.float64, device=dev)
    if first is not None:
        first = _checked_block(first, dim)
        seed[0] = len(first)
        seed[1:] = torch.from_numpy(first.astype(np.float64).sum(axis=0)).to(dev)
    _all_reduce(seed)
    if seed[0] == 0:
        raise InputError("no rows to compute statistics from, on any rank")
    shift = seed[1:] / seed[0]
    n = 0
    total = torch.zeros(dim, dtype=torch.float64, device=dev)
    squares = torch.zeros(dim, dtype=torch.float64, device=dev)
    products = torch.zeros((dim, dim), dtype=torch.float64, device=dev) if outer else None
    abs_max = torch.zeros(1, dtype=torch.float64, device=dev)
    rest = (_checked_block(block, dim) for block in iterator)  # the first block was checked above, once
    for block in itertools.chain([first] if first is not None else [], rest):
        if not len(block):
            continue
        c = torch.from_numpy(block.astype(np.float64, copy=False)).to(dev) - shift
        n += len(block)
        total += c.sum(dim=0)
        squares += (c * c).sum(dim=0)
        if products is not None:
            products += c.T @ c
        abs_max = torch.maximum(abs_max, torch.tensor([float(np.abs(block).max())], dtype=torch.float64, device=dev))
    parts = [torch.tensor([float(n)], dtype=torch.float64, device=dev), total, squares]
    if products is not None:
        parts.append(products.reshape(-1))
    flat = torch.cat(parts)
    _all_reduce(flat)
    _all_reduce(abs_max, dist.ReduceOp.MAX if dist.is_available() else None)
    flat = flat.cpu().numpy()
    return Moments(
        n=int(round(flat[0])),
        shift=shift.cpu().numpy(),
        sum=flat[1 : dim + 1],
        sum_sq=flat[dim + 1 : 2 * dim + 1],
        sum_outer=flat[2 * dim + 1 :].reshape(dim, dim) if outer else None,
        abs_max=float(abs_max.item()),
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


def _row_chunks(X: Any, start: int, stop: int, rows: int) -> Iterator[np.ndarray]:
    """Rows ``[start, stop)`` of an array-like (ndarray, memmap, ShardedEmbeddings) in blocks of ``rows``."""
    if hasattr(X, "iter_chunks"):
        yield from X.iter_chunks(start, stop, rows)
        return
    for a in range(start, stop, rows):
        yield np.asarray(X[a : min(a + rows, stop)])


def _take(X: Any, rows: np.ndarray) -> np.ndarray:
    """Rows at ``rows`` (any order) of an array-like, read in one pass."""
    if hasattr(X, "take") and not isinstance(X, np.ndarray):
        return X.take(rows)
    return np.asarray(X[rows])


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
    """Fit whitening on a corpus split over the ranks; every rank returns the same fitted calibrator.

    Each rank streams its contiguous share of ``X`` and sums float64 moments; the all-reduced sums give the
    exact mean and covariance (:meth:`WhiteningCalibrator.fit_from_moments`), so the result equals
    ``WhiteningCalibrator().fit(np.asarray(X))`` up to rounding (about 1e-13 relative on real embeddings).

    Args:
        X: [N, D] rows readable by every rank, e.g. ``bertflow.scale.reader.open_embeddings(folder)`` on shared storage
            or a memory-mapped ``.npy``. For rows that only this rank holds, use :func:`all_reduce_moments` and
            ``fit_from_moments`` directly.
        calibrator: an unfitted :class:`WhiteningCalibrator` carrying the hyperparameters (default: keep all).
        chunk_rows: rows per block read from disk.
        device: where to accumulate the D x D products (default CPU).
    """
    from ..calibrators import WhiteningCalibrator

    cal = calibrator if calibrator is not None else WhiteningCalibrator()
    n, d = _check_matrix(X)
    rank, world = rank_and_world()
    lo, hi = share(n, rank, world)
    moments = all_reduce_moments(_row_chunks(X, lo, hi, chunk_rows), d, outer=True, device=device)
    return cal.fit_from_moments(moments.n, moments.sum, moments.sum_outer, shift=moments.shift)


class GradientAllReduce:
    """The ``reduce`` hook of :class:`~bertflow.calibrators.flow_trainer.FlowTrainer`: sums every gradient and the loss
    term over the ranks.

    One all-reduce per step of a flat vector (all gradients, then the loss), so the Glow's ~150k gradients cost
    one message, not one per parameter. Every rank then holds identical gradients, clips them identically and
    takes the identical optimiser step, so the parameters never drift apart. With one process it is a no-op.
    """

    def __call__(self, glow: torch.nn.Module, local_loss: torch.Tensor) -> torch.Tensor:
        """All-reduce in place; returns the global batch loss (a 0-d tensor)."""
        params = [p for p in glow.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [local_loss.reshape(1).to(grads[0].dtype)])
        _all_reduce(flat)
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        return flat[-1]


def _rank_batches(
    X: Any,
    train_rows: np.ndarray,
    active: np.ndarray,
    index_batches: Iterator[torch.Tensor],
    rank: int,
    world: int,
    device: torch.device,
    read_steps: int,
) -> Iterator[torch.Tensor]:
    """This rank's rows of each global batch, read from ``X`` ``read_steps`` steps at a time in row order."""
    while True:
        block = [next(index_batches).numpy() for _ in range(read_steps)]
        # Contiguous split of each global batch: shares differ by at most one row.
        local = [np.array_split(train_rows[idx], world)[rank] for idx in block]
        wanted = np.concatenate(local)
        unique, inverse = np.unique(wanted, return_inverse=True)
        data = _take(X, unique)[:, active].astype(np.float32)
        pos = 0
        for part in local:
            sel = inverse[pos : pos + len(part)]
            pos += len(part)
            yield torch.from_numpy(data[sel]).to(device)


class _HeldOutScore:
    """Mean bits per dimension of the held-out rows, each rank scoring its share and the sums all-reduced."""

    def __init__(self, X: Any, rows: np.ndarray, active: np.ndarray, total: int, device: torch.device) -> None:
        self.X, self.rows, self.active, self.total, self.device = X, np.sort(rows), active, total, device
        self._cache: torch.Tensor | None = None
        # Hold the share in memory when it is small (the usual case); stream it from disk otherwise.
        if len(self.rows) * len(active) * 4 <= 512 * 2**20:
            self._cache = self._read(self.rows)

    def _read(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(_take(self.X, rows)[:, self.active].astype(np.float32)).to(self.device)

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
    """Fit BERT-flow on a corpus split over the ranks (data parallel); every rank returns the same flow.

    Reproduces ``FlowCalibrator.fit`` step for step, through the same
    :class:`~bertflow.calibrators.flow_trainer.FlowTrainer`:
    the constant dimensions come from all-reduced moments; the shuffle, held-out split and batch order are drawn
    from the trainer's seeded generator on every rank, exactly as in one process; ActNorm's data-dependent
    initialisation runs on rank 0 on the same rows one process would use, and its parameters are broadcast; at
    every step each rank computes its contiguous share of the global batch of ``batch_size`` rows (read from disk),
    and the gradients are summed (:class:`GradientAllReduce`). The effective batch is therefore ``batch_size``
    whatever the number of ranks, and the result equals the single-process fit up to floating-point summation
    order (which, compounded over the steps, leaves differences around 1e-6 relative in the latents: see the
    tests).

    Rows are read at random positions from ``X``, so every rank must be able to read all of it: a store on shared
    storage, or a copy per node. Memory per rank: the shuffled row order (8 bytes a row) and a few hundred steps
    of rows, not the corpus.

    Args:
        X: [N, D] rows readable by every rank (``bertflow.scale.reader.open_embeddings(folder)``, a memory-mapped
            ``.npy``, or an array).
        calibrator: an unfitted :class:`FlowCalibrator` carrying the hyperparameters (default: the code preset).
        device: this rank's device; default ``calibrator.device`` or ``cuda:{local_rank}`` / ``cpu``.
        chunk_rows: rows per block of the statistics pass.
        read_steps: steps of rows read from disk at a time (sorted, so a memory map is read front to back).

    Returns:
        The fitted calibrator (``n_features_in_``, ``flow_``, ``history_``... set as by ``fit``, by its own
        :meth:`~bertflow.calibrators.flow.FlowCalibrator.fit_from_result`).
    """
    from ..calibrators.flow import FlowCalibrator
    from ..calibrators.flow_trainer import FlowTrainer

    cal = calibrator if calibrator is not None else FlowCalibrator()
    n, d = _check_matrix(X)
    rank, world = rank_and_world()
    dev = torch.device(device or cal.device or default_device())
    trainer = FlowTrainer(cal, device=dev, reduce=GradientAllReduce(), verbose=cal.verbose and rank == 0)
    trainer.check_input(n, d)
    if min(cal.batch_size, n) < world:
        raise InputError(f"batch_size ({cal.batch_size}) must be at least the number of ranks ({world})")
    lo, hi = share(n, rank, world)
    moments = all_reduce_moments(_row_chunks(X, lo, hi, chunk_rows), d, outer=False)
    active = trainer.prepare(moments.mean, moments.std, moments.abs_max, n)
    glow = trainer.build()
    # The trainer's seeded generator draws the split and every batch, as in one process.
    val_rows, train_rows = (rows.numpy() for rows in trainer.split(n))
    if rank == 0:
        init = _take(X, train_rows[: cal.init_samples])[:, active].astype(np.float32)
        trainer.initialize(torch.from_numpy(init).to(dev))
    if world > 1:
        state = broadcast_object({k: v.cpu() for k, v in glow.state_dict().items()} if rank == 0 else None)
        glow.load_state_dict(state)
    batches = _rank_batches(X, train_rows, active, trainer.index_batches(len(train_rows)), rank, world, dev, read_steps)
    evaluate = None
    if len(val_rows):
        vlo, vhi = share(len(val_rows), rank, world)
        evaluate = _HeldOutScore(X, np.sort(val_rows)[vlo:vhi], active, len(val_rows), dev)
    return cal.fit_from_result(trainer.run(batches, len(train_rows), evaluate=evaluate), d)
