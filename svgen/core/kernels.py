"""Kernels on the unit sphere, the median heuristic, and random Fourier features.

Every kernel here L2-normalises its inputs first, so ``||a - b||² = 2 - 2 a·b``.

* RBF:       ``k(a, b) = exp(-||a - b||² / (2σ²))``
* Laplacian: ``k(a, b) = exp(-||a - b|| / σ)``
* Random Fourier features (Rahimi & Recht 2007): ``φ(x) = sqrt(2/m) cos(Ωx + b)`` with
  ``Ω ~ N(0, σ⁻² I)`` (RBF) or Cauchy(0, σ⁻¹) entries (Laplacian) and ``b ~ U[0, 2π)``, so that
  ``E[φ(x)·φ(y)] = k(x, y)``. Orthogonal random features (Yu et al. 2016) draw the Gaussian
  directions from stacked random orthogonal blocks with chi-distributed row norms: same
  expectation, lower variance.
* ``paired=True`` replaces the random phase by a cos/sin pair per frequency,
  ``φ(x) = sqrt(2/m) [cos(Ωx), sin(Ωx)]`` with m/2 frequencies: the same expectation without the
  phase noise term ``cos(ωx + ωy + 2b)`` (Sutherland & Schneider 2015), so lower error at equal m.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from svgen.config import KERNELS  # noqa: F401  (re-exported)


def sq_dists(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``||â_i - b̂_j||²`` for L2-normalised rows, computed as ``2 - 2 â·b̂`` and clamped at 0."""
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    return (2.0 - 2.0 * a @ b.transpose(-1, -2)).clamp_min(0.0)


def kernel_from_sq_dists(d2: torch.Tensor, sigma, kind: str = "rbf") -> torch.Tensor:
    """Kernel values from squared distances: RBF ``exp(-d²/2σ²)`` or Laplacian ``exp(-d/σ)``."""
    if kind == "rbf":
        return torch.exp(-d2 / (2.0 * sigma * sigma))
    if kind == "laplacian":
        return torch.exp(-torch.sqrt(d2 + 1e-12) / sigma)
    raise ValueError(f"unknown kernel {kind!r}; expected one of {KERNELS}")


def kernel(a: torch.Tensor, b: torch.Tensor, sigma, kind: str = "rbf") -> torch.Tensor:
    """The N×M kernel matrix between the rows of ``a`` and ``b`` (both L2-normalised first)."""
    return kernel_from_sq_dists(sq_dists(a, b), sigma, kind)


def median_heuristic(x: torch.Tensor, max_points: int = 2048, seed: int = 0) -> float:
    """Median of the pairwise distances ``||x̂_i - x̂_j||`` over i < j (a random subset if large)."""
    x = F.normalize(x.detach().reshape(-1, x.shape[-1]).float(), dim=-1)
    if x.shape[0] > max_points:
        g = torch.Generator().manual_seed(seed)
        x = x[torch.randperm(x.shape[0], generator=g)[:max_points]]
    d2 = sq_dists(x, x)
    iu = torch.triu_indices(x.shape[0], x.shape[0], offset=1)
    return float(np.median(torch.sqrt(d2[iu[0], iu[1]]).numpy()))  # the mean of the middle two when even


class RandomFourierFeatures:
    """``φ(x) = sqrt(2/m) cos(x̂ Ω₀ᵀ / σ + b)`` approximating the RBF or Laplacian kernel.

    ``Ω₀`` is drawn once for unit bandwidth; σ is applied at call time, so a learned σ rescales
    the same features (and gradients reach log σ).
    """

    def __init__(self, dim: int, n_features: int, kind: str = "rbf", orthogonal: bool = False, seed: int = 0,
                 paired: bool = False):
        if kind not in KERNELS:
            raise ValueError(f"unknown kernel {kind!r}; expected one of {KERNELS}")
        if orthogonal and kind != "rbf":
            raise ValueError("orthogonal random features are defined for the RBF kernel only")
        if paired and n_features % 2:
            raise ValueError(f"paired (cos/sin) features need an even number of features, got {n_features}")
        g = torch.Generator().manual_seed(seed)
        self.dim, self.n_features, self.kind, self.orthogonal, self.paired = dim, n_features, kind, orthogonal, paired
        n_freq = n_features // 2 if paired else n_features
        if kind == "laplacian":
            # exp(-||δ||/σ) has a multivariate Cauchy spectrum: Gaussian direction / |N(0,1)|.
            omega = torch.randn(n_freq, dim, generator=g) / torch.randn(n_freq, 1, generator=g).abs()
        elif orthogonal:
            blocks = []
            for _ in range(math.ceil(n_freq / dim)):
                q, r = torch.linalg.qr(torch.randn(dim, dim, generator=g))
                q = q * torch.sign(torch.diagonal(r))[None, :]
                norms = torch.randn(dim, dim, generator=g).norm(dim=1, keepdim=True)  # chi(dim) lengths
                blocks.append(q.T * norms)
            omega = torch.cat(blocks)[:n_freq]
        else:
            omega = torch.randn(n_freq, dim, generator=g)
        self.omega = omega
        self.phase = torch.rand(n_freq, generator=g) * (2 * math.pi)

    def __call__(self, x: torch.Tensor, sigma) -> torch.Tensor:
        x = F.normalize(x, dim=-1)
        proj = x @ self.omega.to(x.dtype).T / sigma
        if self.paired:
            return math.sqrt(2.0 / self.n_features) * torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1)
        return math.sqrt(2.0 / self.n_features) * torch.cos(proj + self.phase.to(x.dtype))
