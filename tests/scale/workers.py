"""Rank bodies for the multi-process tests (a plain module, so spawned ranks can import them).

Every rank runs with one CPU thread, as the single-process references in the tests do: two ranks share the
two cores of CI, and CPU kernels are then bit-for-bit reproducible between the ranks and the reference.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

#: Flow settings fitted in the tests: the default preset with a held-out split, and an odd batch size (ranks get
#: 19 and 18 rows of every batch) with affine couplings and a learned LU permutation.
FLOW_CONFIGS: dict[str, dict[str, Any]] = {
    "code-val": dict(epochs=3, validation_fraction=0.1, eval_every=5, seed=1),
    "affine-lu-odd-batch": dict(batch_size=37, max_steps=25, coupling="affine", permutation="lu", seed=2),
}

ENCODE = dict(shard_size=32, chunk_size=16, batch_size=8)


def fit_then_encode_with_a_kill(device: str, args: dict[str, str]) -> None:
    """Fit whitening and flows on a store, save what every rank got; then encode, with rank 1 killed mid-shard.

    Rank 1 SIGKILLs itself at the second write of its second shard, like an OOM kill or a node failure: its
    first shard is complete, the second is a temporary file, and the launcher stops rank 0 wherever it is.
    """
    from bertflow import FlowCalibrator, SentenceEncoder
    from bertflow.scale.encode import encode_file_to_store
    from bertflow.scale.fit import fit_flow_distributed, fit_whitening_distributed
    from bertflow.scale.reader import open_embeddings
    from bertflow.scale.shards import ShardWriter

    torch.set_num_threads(1)
    rank = dist.get_rank()
    out = Path(args["out"])
    X = open_embeddings(args["fit_store"])
    white = fit_whitening_distributed(X)
    np.savez(out / f"white-{rank}.npz", mean=white.mean_, components=white.components_, var=white.explained_variance_)
    full = np.asarray(X)
    for name, config in FLOW_CONFIGS.items():
        flow = fit_flow_distributed(X, FlowCalibrator(**config), device=device)
        np.savez(
            out / f"flow-{name}-{rank}.npz",
            z=flow.transform(full),
            passthrough=flow.passthrough_,
            train_bpd=np.array(flow.history_["train_bpd"]),
            val_bpd=np.array(flow.history_["val_bpd"]),
            best_step=flow.best_step_,
        )

    if rank == 1:
        original = ShardWriter.write
        seen: dict[str, int] = {"shards": 0, "writes": 0}

        def write_then_die(self: ShardWriter, rows: np.ndarray) -> None:
            if self.spec.index != seen.get("last"):
                seen["last"], seen["shards"], seen["writes"] = self.spec.index, seen["shards"] + 1, 0
            seen["writes"] += 1
            if seen["shards"] == 2 and seen["writes"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            original(self, rows)

        ShardWriter.write = write_then_die  # type: ignore[method-assign]
    encoder = SentenceEncoder(args["model"], pooling="mean", device=device)
    encode_file_to_store(args["input"], args["store"], encoder, **ENCODE)
