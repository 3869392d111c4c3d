"""The closed-form kernel ridge solves: the vote weights ``A = (K_SS + M·λ·I)⁻¹ Y`` of class-major support vectors,
the choice of λ over one eigendecomposition (leave-one-out or GCV), and the top eigenvalue that scales λ."""

from __future__ import annotations

import math
from typing import Iterable, Sequence, Tuple

import torch

DEFAULT_LAMBDAS: Iterable[float] = tuple(10.0 ** p for p in range(-6, 1))


def one_hot_blocks(n_classes: int, n_support: int, dtype=torch.float32) -> torch.Tensor:
    """The M×C class indicator Y of class-major support vectors (K consecutive rows per class)."""
    return torch.repeat_interleave(torch.eye(n_classes, dtype=dtype), n_support, dim=0)


def krr_vote_weights(K_ss: torch.Tensor, Y: torch.Tensor, lam: float) -> torch.Tensor:
    """Kernel ridge classification ``A = (K_SS + M·λ·I)⁻¹ Y``: one Cholesky for all C columns.

    Differentiable: gradients flow through the factorisation into ``K_SS`` (never detached).
    """
    M = K_ss.shape[0]
    system = K_ss + (M * lam) * torch.eye(M, dtype=K_ss.dtype, device=K_ss.device)
    L = torch.linalg.cholesky(system)
    return torch.cholesky_solve(Y.to(K_ss.dtype), L)


def ridge_path_scores(
    K_ss: torch.Tensor, Y: torch.Tensor, lambdas: Sequence[float], criterion: str = "loo"
) -> Tuple[list, list]:
    """Closed-form model selection for λ over one eigendecomposition ``K = U diag(e) Uᵀ``.

    With ``H_c = K (K + cI)⁻¹ = U diag(e/(e+c)) Uᵀ`` and ``c = M·λ``:

    * ``loo``: leave-one-out residuals ``(Y - H Y)_i / (1 - H_ii)``; the score is the LOO
      misclassification rate (argmax of the LOO prediction vs the true class), ties broken by
      the mean squared LOO residual.
    * ``gcv``: generalised cross-validation ``M ||(I - H) Y||² / (M - tr H)²``.

    Returns (scores, lambdas) with lower scores better.
    """
    M = K_ss.shape[0]
    e, U = torch.linalg.eigh(K_ss.double())
    e = e.clamp_min(0)
    UtY = U.T @ Y.double()
    U2 = U * U
    truth = Y.argmax(dim=1)
    scores = []
    for lam in lambdas:
        c = M * lam
        shrink = e / (e + c)
        fitted = U @ (shrink[:, None] * UtY)
        resid = Y.double() - fitted
        if criterion == "gcv":
            scores.append(float(M * (resid ** 2).sum() / (M - shrink.sum()) ** 2))
            continue
        h = (U2 @ shrink).clamp(max=1 - 1e-9)
        loo_resid = resid / (1 - h)[:, None]
        loo_pred = Y.double() - loo_resid
        err = float((loo_pred.argmax(dim=1) != truth).double().mean())
        mse = float((loo_resid ** 2).sum(dim=1).mean())
        scores.append(err + 1e-6 * mse)
    return scores, list(lambdas)


def top_eigenvalue(K: torch.Tensor, iters: int = 50, tol: float = 0.0) -> float:
    """Largest eigenvalue of a PSD matrix by power iteration from the all-ones vector; stops early
    once the estimate changes by at most ``tol`` (relative; 0 runs all ``iters``)."""
    v = torch.ones(K.shape[0], dtype=K.dtype) / math.sqrt(K.shape[0])
    lam = 0.0
    for _ in range(iters):
        w = K @ v
        prev, lam = lam, float(w.norm())
        v = w / max(lam, 1e-300)
        if abs(lam - prev) <= tol * lam:
            break
    return lam
