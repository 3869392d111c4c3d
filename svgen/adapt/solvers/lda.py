"""Shared-covariance LDA with the text prototypes as prior means: its weights, its exact leave-one-out logits
(rank-one downdates of the class mean and the scatter) and its refits without folds (docs/fewshot.md)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional, Sequence

import numpy as np
import torch


def prior_means(prototypes: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Text prototypes moved onto the images (the modality gap): ``m_c = p̂_c − mean_c p̂_c + mean_i x_i``."""
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1)
    return P - P.mean(dim=0) + X.mean(dim=0)


def spread_ratio(zero_shot: np.ndarray, lda_logits: np.ndarray) -> float:
    """``s = std(Z − row means) / std(L − row means)`` on the same images (no labels)."""
    zc = zero_shot - zero_shot.mean(axis=1, keepdims=True)
    lc = lda_logits - lda_logits.mean(axis=1, keepdims=True)
    return float(np.std(zc) / max(float(np.std(lc)), 1e-12))


def class_means(X: torch.Tensor, y: torch.Tensor, n_classes: int) -> tuple:
    """(shots per class, their sums, their means: 0 for a class without shots)."""
    n = torch.bincount(y, minlength=n_classes).to(X.dtype)
    sums = torch.zeros(n_classes, X.shape[1], dtype=X.dtype).index_add_(0, y, X)
    return n, sums, sums / n.clamp_min(1)[:, None]


def loo_basis(X: torch.Tensor, y: torch.Tensor, m: torch.Tensor, score_rows=None) -> SimpleNamespace:
    """What every (γ, κ) of :func:`lda_loo_scores` shares: the scatter's eigenbasis, the scored shots in it."""
    N, D = X.shape
    n, sums, xbar = class_means(X, y, m.shape[0])
    R = X - xbar[y]
    omega, V = (torch.from_numpy(a) for a in np.linalg.eigh((R.T @ R).numpy()))   # numpy's LAPACK: ~2.5× faster
    omega = omega.clamp_min(0)
    C_shot, trace = int((n > 0).sum()), float(omega.sum())
    df = {True: max(N - 1 - C_shot, 1), False: max(N - C_shot, 1)}   # S_w's df without shot i: its class kept or not
    centre = X.mean(dim=0) @ V
    if score_rows is not None:
        idx = torch.as_tensor(score_rows, dtype=torch.long)
        X, R, y = X[idx], R[idx], y[idx]
    Xv, n_i = X @ V, n[y]
    many = n_i > 1                                     # leaving i out keeps class y_i in the data
    return SimpleNamespace(n=n, omega=omega, df=df, tau=trace / (df[False] * D) if trace > 0 else 1.0, y=y,
                           centre=centre, xbar_v=xbar @ V, m_v=m @ V, U=R @ V, Xv=Xv, n_i=n_i,
                           many=many, own_sum=sums[y] @ V - Xv, rows=torch.arange(y.numel()),
                           scale=torch.where(many, n_i / (n_i - 1).clamp_min(1), torch.zeros_like(n_i)))


def lda_loo_scores(X: torch.Tensor, y: torch.Tensor, m: torch.Tensor, gammas: Sequence[float],
                   kappas: Sequence[float], score_rows=None):
    """Yields ``((a, b), N×C logits)`` per (γ_a, κ_b): the exact leave-one-out of the head svgen fits
    (:func:`lda_head_weights`, ``equal_radius``) at ``score_rows`` (None: all; every shot still fits)."""
    s = loo_basis(X, y, m, score_rows)
    n, y, m_v, many = s.n, s.y, s.m_v, s.many
    E = s.Xv - s.centre
    for a, g in enumerate(gammas):
        binv = {f: 1.0 / ((1 - g) * s.omega / s.df[f] + g * s.tau) for f in (True, False)}
        Binv = torch.where(many[:, None], binv[True][None], binv[False][None])          # N×D
        beta = (1 - g) * s.scale / torch.where(many, torch.tensor(float(s.df[True])), torch.tensor(float(s.df[False])))
        w = Binv * s.U
        coef = beta / (1 - beta * (s.U * w).sum(dim=1))   # Σ_{-i}⁻¹ = B_i⁻¹ + coef_i w_i w_iᵀ
        EB, ew = E * Binv, (E * w).sum(dim=1)
        for b, k in enumerate(kappas):   # the means at prior strength k
            mu = (n[:, None] * s.xbar_v + k * m_v) / (n + k).clamp_min(1e-12)[:, None]
            mu[n == 0] = m_v[n == 0]                   # a class without shots: its prior mean, as in the head
            own = (s.own_sum + k * m_v[y]) / (s.n_i - 1 + k).clamp_min(1e-12)[:, None]
            own[~many] = m_v[y[~many]]                 # the class's only shot left out: its prior mean
            Dm, Do = mu - s.centre, own - s.centre
            WD, wo = w @ Dm.T, (w * Do).sum(dim=1)
            q = torch.where(many[:, None], ((Dm * Dm) @ binv[True])[None], ((Dm * Dm) @ binv[False])[None])
            num = EB @ Dm.T + coef[:, None] * ew[:, None] * WD
            den = q + coef[:, None] * WD * WD
            num[s.rows, y] = (EB * Do).sum(dim=1) + coef * ew * wo
            den[s.rows, y] = (Do * Do * Binv).sum(dim=1) + coef * wo * wo
            norm = den.clamp_min(1e-300).sqrt()
            yield (a, b), norm.mean(dim=1, keepdim=True) * num / norm


def lda_covariance(X, y, n_classes: int, gamma: float, tau: Optional[float] = None) -> torch.Tensor:
    """``Σ = (1−γ) S_w/df + γ τ I`` (the identity where there is no scatter)."""
    N, D = X.shape
    n, _, xbar = class_means(X, y, n_classes)
    R = X - xbar[y]
    S = R.T @ R / max(N - int((n > 0).sum()), 1)
    if tau is None:
        tau = float(torch.diagonal(S).sum()) / D
    Sigma = (1 - gamma) * S + gamma * tau * torch.eye(D, dtype=X.dtype)
    return torch.eye(D, dtype=X.dtype) if float(torch.diagonal(Sigma).sum()) <= 0 else Sigma


def lda_head_weights(X, y, m, gamma: float, kappa: float, tau: Optional[float] = None, equal_radius: bool = False,
                     centre: Optional[torch.Tensor] = None):
    """(W C×D, b C): LDA with means ``(n_c x̄_c + κ m_c)/(n_c + κ)``, optionally at one radius from ``centre``."""
    n, _, xbar = class_means(X, y, m.shape[0])
    Sigma = lda_covariance(X, y, m.shape[0], gamma, tau)
    mu = (n[:, None] * xbar + kappa * m) / (n + kappa).clamp_min(1e-12)[:, None]
    mu[n == 0] = m[n == 0]
    if not equal_radius:
        W = torch.linalg.solve(Sigma, mu.T).T
        return W, -0.5 * (W * mu).sum(dim=1)
    cen = X.mean(dim=0) if centre is None else centre.to(X.dtype)
    d = mu - cen
    W = torch.linalg.solve(Sigma, d.T).T
    norm = (W * d).sum(dim=1).clamp_min(1e-300).sqrt()
    W = norm.mean() * W / norm[:, None]
    return W, -(W @ cen)


def fold_logits(X: torch.Tensor, y: torch.Tensor, m: torch.Tensor, gamma: float, kappa: float, folds: list,
                pool: Optional[np.ndarray] = None) -> np.ndarray:
    """The LDA head at (γ, κ) refitted without each fold's removed shots (of ``pool``, None: all), its logits at the
    fold's scored shots, stacked in the folds' order."""
    out = []
    for removed, scored in folds:
        keep = torch.from_numpy(np.setdiff1d(np.arange(len(y)) if pool is None else pool, removed))
        W, b = lda_head_weights(X[keep], y[keep], m, gamma, kappa, equal_radius=True)
        out.append((X[scored] @ W.T + b).numpy())
    return np.concatenate(out)
