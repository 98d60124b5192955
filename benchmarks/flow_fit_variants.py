"""Experiment: how fast could ``FlowCalibrator.fit`` be with three changes to its training loop?

``calibrators/flow.py`` belongs to another developer; this file measures a proposal without touching it. The
subclass below reproduces ``FlowCalibrator._train`` (same optimiser, clipping, batches, history, held-out
selection) with three changes, each aimed at the per-step overhead that dominates a flow of 150k parameters:

1. No host synchronisation per step. The original checks ``torch.isfinite(loss) and torch.isfinite(norm)``
   in Python every step (two device->host syncs). Here the check accumulates in a device flag and is read
   every ``check_every`` steps; on divergence the parameters of the last checked step are restored.
2. No full state copy per step. The original clones every parameter and buffer after each step (about 60
   small copies) so that it can roll back one step; here a snapshot is taken with one ``torch._foreach_copy_``
   at each check.
3. Batches come from a permutation held on the device (sliced per step) instead of indexing the device data
   with a CPU index tensor (a host->device copy per step), and AdamW uses its fused CUDA kernel.

Same data order and updates as the original (the permutations come from the same seeded generator), so the
fitted flow matches it up to floating-point noise. ``GraphFlowCalibrator`` goes further and replays the whole
step as a CUDA graph. Run: ``python benchmarks/flow_fit_variants.py --rows 100000``.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from bertflow.calibrators import FlowCalibrator
from bertflow.errors import DivergenceError


class FastLoopFlowCalibrator(FlowCalibrator):
    """``FlowCalibrator`` with the training loop described in the module docstring (for measurement only)."""

    check_every = 100

    def _train(self, glow, train, val, gen) -> None:  # noqa: ANN001 - same signature as the parent
        n = len(train)
        size = min(self.batch_size, n)
        total = self.max_steps or max(1, math.ceil(self.epochs * n / size))
        fused = train.device.type == "cuda"
        opt = torch.optim.AdamW(glow.parameters(), lr=self.lr, weight_decay=self.weight_decay, fused=fused or None)
        params = list(glow.parameters())
        state = list(glow.state_dict().values())
        snapshot = [t.detach().clone() for t in state]
        snapshot_step = 0
        bad = torch.zeros((), dtype=torch.bool, device=train.device)
        history: dict[str, list[float]] = {"step": [], "train_bpd": [], "val_step": [], "val_bpd": []}
        best = (math.inf, 0, None)
        log_every = max(1, total // 100)
        # The same index stream as the parent's _batches: shuffled epochs, every batch full (wrapping around).
        perms, covered = [], 0
        while covered < total * size:
            perms.append(torch.randperm(n, generator=gen))
            covered += n
        index = torch.cat(perms).to(train.device)
        glow.train()
        for step in range(1, total + 1):
            idx = index[(step - 1) * size : step * size]
            loss = glow.bits_per_dim(train[idx]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            bad |= ~(torch.isfinite(loss) & torch.isfinite(norm))
            opt.step()
            checked = step % self.check_every == 0 or step == total
            if checked:
                if bool(bad):
                    torch._foreach_copy_(state, snapshot)
                    self.n_steps_, self.best_step_, self.history_ = snapshot_step, snapshot_step, history
                    raise DivergenceError(
                        f"flow fitting diverged between steps {snapshot_step + 1} and {step} of {total}; "
                        f"the parameters of step {snapshot_step} were kept"
                    )
                torch._foreach_copy_(snapshot, state)
                snapshot_step = step
            if step % log_every == 0 or step == total:
                history["step"].append(step)
                history["train_bpd"].append(loss.item())
            if len(val) and (step % self.eval_every == 0 or step == total):
                vbpd = self._mean_bpd(glow, val)
                history["val_step"].append(step)
                history["val_bpd"].append(vbpd)
                if vbpd < best[0]:
                    best = (vbpd, step, {k: v.detach().clone() for k, v in glow.state_dict().items()})
        self.n_steps_ = total
        self.best_step_ = total
        if best[2] is not None:
            glow.load_state_dict(best[2])
            self.best_step_ = best[1]
        self.history_ = history


class GraphFlowCalibrator(FastLoopFlowCalibrator):
    """The fast loop with one whole training step (batch gather, forward, backward, clipping, AdamW) captured
    in a CUDA graph and replayed: a step of this 150k-parameter flow is ~700 tiny kernels whose launches
    cost far more host time than the GPU spends on them. Falls back to the fast loop off CUDA.

    Warm-up steps (needed before capture) run on a side stream and are then undone: the parameters are copied
    back and the optimiser state is zeroed in place, so training starts from the same state as the original.
    """

    def _train(self, glow, train, val, gen) -> None:  # noqa: ANN001 - same signature as the parent
        if train.device.type != "cuda":
            return super()._train(glow, train, val, gen)
        n = len(train)
        size = min(self.batch_size, n)
        total = self.max_steps or max(1, math.ceil(self.epochs * n / size))
        perms, covered = [], 0
        while covered < total * size:
            perms.append(torch.randperm(n, generator=gen))
            covered += n
        index = torch.cat(perms).to(train.device)
        params = list(glow.parameters())
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, capturable=True, foreach=True)
        state = list(glow.state_dict().values())
        start_state = [t.detach().clone() for t in state]
        static_idx = index[:size].clone()
        bad = torch.zeros((), dtype=torch.bool, device=train.device)
        static_loss = torch.zeros((), device=train.device)

        def step() -> None:
            loss = glow.bits_per_dim(train.index_select(0, static_idx)).mean()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm, foreach=True)
            bad.logical_or_(~(torch.isfinite(loss) & torch.isfinite(norm)))
            opt.step()
            static_loss.copy_(loss.detach())

        glow.train()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=False)
                step()
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():
            torch._foreach_copy_(state, start_state)
            for values in opt.state.values():
                for v in values.values():
                    if torch.is_tensor(v):
                        v.zero_()
            bad.zero_()
        graph = torch.cuda.CUDAGraph()
        grads = [p.grad for p in params]
        with torch.cuda.graph(graph):
            torch._foreach_zero_(grads)
            step()
        snapshot = [t.detach().clone() for t in state]
        snapshot_step = 0
        history: dict[str, list[float]] = {"step": [], "train_bpd": [], "val_step": [], "val_bpd": []}
        best = (math.inf, 0, None)
        log_every = max(1, total // 100)
        for k in range(1, total + 1):
            static_idx.copy_(index[(k - 1) * size : k * size])
            graph.replay()
            if k % self.check_every == 0 or k == total:
                if bool(bad):
                    with torch.no_grad():
                        torch._foreach_copy_(state, snapshot)
                    self.n_steps_, self.best_step_, self.history_ = snapshot_step, snapshot_step, history
                    raise DivergenceError(
                        f"flow fitting diverged between steps {snapshot_step + 1} and {k} of {total}; "
                        f"the parameters of step {snapshot_step} were kept"
                    )
                with torch.no_grad():
                    torch._foreach_copy_(snapshot, state)
                snapshot_step = k
            if k % log_every == 0 or k == total:
                history["step"].append(k)
                history["train_bpd"].append(static_loss.item())
            if len(val) and (k % self.eval_every == 0 or k == total):
                vbpd = self._mean_bpd(glow, val)
                history["val_step"].append(k)
                history["val_bpd"].append(vbpd)
                if vbpd < best[0]:
                    best = (vbpd, k, {key: v.detach().clone() for key, v in glow.state_dict().items()})
        self.n_steps_ = total
        self.best_step_ = total
        if best[2] is not None:
            glow.load_state_dict(best[2])
            self.best_step_ = best[1]
        self.history_ = history


def compare(X: np.ndarray, device: str, max_steps: int | None = None) -> dict[str, float]:
    """Fit the three loops on ``X``; return their times and each one's largest latent difference to the original."""
    out: dict[str, float] = {}
    fitted = {}
    for name, cls in (
        ("original", FlowCalibrator),
        ("fast_loop", FastLoopFlowCalibrator),
        ("cuda_graph", GraphFlowCalibrator),
    ):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fitted[name] = cls(device=device, max_steps=max_steps).fit(X)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out[f"{name}_seconds"] = time.perf_counter() - start
        out[f"{name}_steps"] = fitted[name].n_steps_
    probe = X[:2048]
    ref = fitted["original"].transform(probe)
    for name in ("fast_loop", "cuda_graph"):
        out[f"{name}_max_abs_latent_diff"] = float(np.abs(ref - fitted[name].transform(probe)).max())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-steps", type=int, default=None)
    args = parser.parse_args()
    X = np.random.default_rng(0).normal(size=(args.rows, args.dim)).astype(np.float32)
    print(compare(X, args.device, args.max_steps))


if __name__ == "__main__":
    main()
