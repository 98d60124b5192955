"""Issue 23, sixteenth pass: a calibrator's transform on a CUDA stream of its own, so the next chunk's forward does
not wait for it (the variant that ``transform_probe.py`` times beside the library).

Why: in the library, ``ModelRunner.launch`` queues a chunk's transform on the stream of the forward passes, so the
GPU runs it between two chunks' forwards. A flow's transform alone takes 5.7 ms of GPU time per 40,000 BERT-base
sentences (fifteenth pass, call g: about 2.3% of a 0.25 s pass, more than the 2% bar by itself). On another stream it
may overlap the next chunk's forward (memory-bound kernels beside the forward's matmuls, or in the forward's gaps).

The variant wraps the runner's ``launch``: the library's launch without the transform (forward, pooling, input order,
the pooled check), then, on the side stream once the pooled vectors are ready, the library's transform steps (the
bound, the transform, its check) and the chunk's event. The same kernels on another stream: the same bits.
"""

from __future__ import annotations

from typing import Any

import torch

from bertflow.encoding.forward import Pending
from bertflow.validation import OUTPUT_LIMIT


def side_stream(encoder: Any) -> Any:
    """``encoder`` (a CUDA ``SentenceEncoder``) with its transforms run on a stream of their own."""
    if encoder.device.type != "cuda":
        raise SystemExit("the side-stream variant needs a CUDA encoder")
    runner = encoder._runner
    launch = runner.launch
    side = torch.cuda.Stream(encoder.device)

    @torch.inference_mode()
    def launch_side(chunk: Any, plan: Any, transform: Any = None, *args: Any) -> Pending:
        if transform is None:
            return launch(chunk, plan, None, *args)
        pending = launch(chunk, plan, None, *args)
        side.wait_event(pending.event)
        with torch.cuda.stream(side):
            result = pending.result
            result.record_stream(side)  # made on the forward's stream: not reused there before the side is done
            pending.checks.record_stream(side)
            limit = OUTPUT_LIMIT * result.abs().amax().clamp_min(1.0)
            out = transform(result).float()
            out_bad = ~(out.abs() <= limit).all()
            checks = torch.stack([pending.checks[0], out_bad.float(), limit.float()])
            event = torch.cuda.Event()
            event.record(side)
        return Pending(pending.offset, out, checks, event)

    runner.launch = launch_side
    return encoder
