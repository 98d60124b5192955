"""Channel mixings between coupling layers: fixed permutations and Glow's learned invertible 1x1 conv.

A sentence embedding is treated as a 1x1 image whose channels are the features, so a "1x1 convolution" is
just a ``[C, C]`` matrix applied to every ``[B, C]`` row.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bertflow.flows.base import Transform
from bertflow.validation import check_positive_int


class ReversePermutation(Transform):
    """Reverses the order of the features (the official BERT-flow code's default; log-det 0)."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = check_positive_int("ReversePermutation num_features", num_features)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Reverses the features."""
        return x.flip(1), x.new_zeros(x.shape[0])

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Reverses the features back (reversal is its own inverse)."""
        return y.flip(1), y.new_zeros(y.shape[0])


class RandomPermutation(Transform):
    """A fixed random permutation of the features (the BERT-flow paper's variant; log-det 0).

    The permutation is drawn once from ``seed`` and stored as the long buffer ``perm`` (output feature ``i``
    is input feature ``perm[i]``), so a loaded ``state_dict`` restores it exactly even if the seed changed.
    """

    def __init__(self, num_features: int, seed: int = 0) -> None:
        super().__init__()
        self.num_features = check_positive_int("RandomPermutation num_features", num_features)
        gen = torch.Generator().manual_seed(int(seed))
        self.register_buffer("perm", torch.randperm(self.num_features, generator=gen))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Permutes the features."""
        return x[:, self.perm], x.new_zeros(x.shape[0])

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Applies the inverse permutation."""
        # Derived on the fly rather than cached so it can never go stale after load_state_dict.
        return y[:, torch.argsort(self.perm)], y.new_zeros(y.shape[0])


class InvertibleLinearLU(Transform):
    """Learned invertible 1x1 convolution in Glow's LU parametrisation.

    ``y = x @ W.T`` with ``W = P @ L @ (U + diag(sign_s * exp(log_abs_s)))``, where ``P`` is a fixed
    permutation (long buffer ``perm``: row ``i`` of ``P @ M`` is row ``perm[i]`` of ``M``), ``L`` is unit
    lower triangular (parameter ``lower``, masked to its strict lower part), ``U`` is strictly upper
    triangular (parameter ``upper``, masked), ``sign_s`` is a fixed buffer and ``log_abs_s`` a parameter.
    The log-determinant is ``sum(log_abs_s)`` for every sample, so it costs nothing to evaluate.

    ``W`` starts as a random orthogonal matrix drawn from ``seed`` (log-det 0 at initialisation).
    """

    def __init__(self, num_features: int, seed: int = 0) -> None:
        super().__init__()
        self.num_features = n = check_positive_int("InvertibleLinearLU num_features", num_features)
        gen = torch.Generator().manual_seed(int(seed))
        # Drawn and factorised in float64 so that float32 parameters are the rounded exact factors.
        # geqrf + householder_product and lu_factor stand in for linalg.qr / linalg.lu, which are ~100x slower
        # on CPU for small matrices in some torch builds (tens of ms per call, and this runs once per step).
        reflectors, tau = torch.geqrf(torch.randn(n, n, generator=gen, dtype=torch.float64))
        q = torch.linalg.householder_product(reflectors, tau)
        # Sign-fix makes Q Haar-distributed (plain QR is biased by the sign convention of R's diagonal).
        q = q * torch.sign(torch.diagonal(reflectors)).unsqueeze(0)
        packed, pivots = torch.linalg.lu_factor(q)  # L below the diagonal (unit diagonal implied), U on and above
        # LAPACK pivots are sequential 1-based row swaps with q[rows] = L U; W = P L U then takes row
        # perm[i] of L U for output i, where perm is the inverse of `rows`.
        rows = list(range(n))
        for i, j in enumerate(pivots.tolist()):
            rows[i], rows[j - 1] = rows[j - 1], rows[i]
        perm = torch.argsort(torch.tensor(rows, dtype=torch.long))
        s = torch.diagonal(packed)
        dtype = torch.get_default_dtype()
        self.register_buffer("perm", perm)
        self.register_buffer("sign_s", torch.sign(s).to(dtype))
        self.lower = nn.Parameter(torch.tril(packed, -1).to(dtype))
        self.upper = nn.Parameter(torch.triu(packed, 1).to(dtype))
        self.log_abs_s = nn.Parameter(torch.log(torch.abs(s)).to(dtype))
        # The masks are pure functions of n: not persistent, but buffers so they follow .to() / .double().
        self.register_buffer("lower_mask", torch.tril(torch.ones(n, n, dtype=dtype), -1), persistent=False)
        self.register_buffer("upper_mask", torch.triu(torch.ones(n, n, dtype=dtype), 1), persistent=False)
        self.register_buffer("eye", torch.eye(n, dtype=dtype), persistent=False)

    def _factors(self) -> tuple[Tensor, Tensor]:
        """Returns the unit lower factor ``L`` and the full upper factor ``U + diag(s)``, each ``[C, C]``."""
        lower = self.lower * self.lower_mask + self.eye
        upper = self.upper * self.upper_mask + torch.diag(self.sign_s * torch.exp(self.log_abs_s))
        return lower, upper

    def weight(self) -> Tensor:
        """The current ``[C, C]`` matrix ``W`` (``y = x @ W.T``)."""
        lower, upper = self._factors()
        return (lower @ upper)[self.perm]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Mixes the features with ``W``."""
        lower, upper = self._factors()
        if x.shape[0] < self.num_features:
            # Applying the factors one by one costs O(B C^2) instead of the O(C^3) of forming W: ~10x less
            # work for minibatches of 768-d embeddings, and the same result up to rounding.
            y = ((x @ upper.T) @ lower.T)[:, self.perm]
        else:
            y = x @ ((lower @ upper)[self.perm]).T
        return y, self.log_abs_s.sum().expand(x.shape[0])

    def inverse(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """Solves ``y = x @ W.T`` for ``x`` with two triangular solves (no explicit inverse)."""
        lower, upper = self._factors()
        # Column form: y.T = P L U x.T, so x.T = U^-1 L^-1 P^T y.T; P^T picks rows by the inverse permutation.
        rhs = y.T[torch.argsort(self.perm)]
        rhs = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        x = torch.linalg.solve_triangular(upper, rhs, upper=True).T
        return x, (-self.log_abs_s.sum()).expand(y.shape[0])
