"""Types shared across layers, defined once. Importing this module does not load torch."""

from __future__ import annotations

# typing's Callable, not collections.abc's: it turns the strings below into forward references, so the alias is a
# real type at run time (usable in ``X | None``, resolved by ``typing.get_type_hints`` where torch is imported)
# without importing torch here.
from typing import TYPE_CHECKING, Callable  # noqa: UP035

if TYPE_CHECKING:
    import torch  # noqa: F401 (named by the forward references)

#: A function applied on one device to a batch of vectors: float32 tensor [n, D] -> float32 tensor [n, D'] on the
#: same device. A calibrator's map (``Calibrator.torch_transform``), which the encoder applies to each chunk of
#: pooled vectors before they are copied to the host.
DeviceTransform = Callable[["torch.Tensor"], "torch.Tensor"]

#: The same type under the name the calibrators use.
TorchTransform = DeviceTransform
