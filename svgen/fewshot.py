"""Labelled images ("shots") in the kernel machine: closed-form heads chosen by exact leave-one-out.

Both heads are ridge regressions of the class indicator Y on the shots, *towards the zero-shot
head* (the text head is the prior mean; the images fit what it gets wrong):

* kernel vote over the support set ``[T; X]`` (text rows T, image rows X), one bandwidth σ::

      f(x) = α·F(x) + s₀·k(x, X) B,     F(x) = k(x, T) A_T(σ),
      B = (K_XX + c·I)⁻¹ (Y − α F(X)/s₀)                      (c = N·λ; K_XX has a unit diagonal)

  so the artifact's vote weights are ``[α A_T ; s₀ B]`` and the scoring formula is unchanged,
  ``exp(-||x̂ - s||²/2σ²) @ vote_weights``. ``A_T(σ)`` is the zero-shot solve over the text rows
  (``(K_TT + M_T λ_T I)⁻¹ Y_T`` with the artifact's own λ rule), and ``s₀`` puts F on the scale of
  Y (the mean spread ``max_c F − mean_c F`` over the shots). α = 1 with no images is the
  zero-shot head exactly; as shots accumulate, the data term dominates the fixed prior.
* linear: ``argmin ||X̂ ΔWᵀ + Δb − (Y − α F_lin(X)/s₀)||² + λ||ΔW||²`` (unpenalised bias),
  i.e. ridge towards the text head ``W = α W_T + s₀ ΔW`` — ``λ||W − αW_T||²`` in the issue's words.

σ, λ (c) and α are chosen by exact leave-one-out over the shots (image to image): for a linear
smoother ``Ŷ = αF + H(Y − αF)`` the LOO prediction is
``αF_i + ((HR)_i − H_ii R_i)/(1 − H_ii)`` with ``R = Y − αF``, so one eigendecomposition of
``K_XX`` per σ (one SVD of the centred shots for the linear head) scores every (λ, α) pair.
The rule is the one-standard-error rule towards the smoother model: among settings whose LOO
error is within one binomial standard error of the best, take the largest σ, then the largest
λ. Shots in the benchmark are averages of augmented views, tighter than single-crop queries; the
plain LOO minimum then prefers too small a σ, the 1-SE rule does not (docs/fewshot.md).

Classes without shots cannot be judged by LOO; when there are any, α is fixed at 1 (the text
head keeps its full weight and the shots correct it) instead of being chosen.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .kernels import kernel, median_heuristic
from .support import SupportSet

log = logging.getLogger(__name__)

SIGMA_FACTORS = (0.35, 0.5, 0.7, 1.0, 1.4)          # × the median image-to-image distance
KERNEL_RIDGES = tuple(10.0 ** p for p in np.arange(-3.0, 2.01, 0.5))   # c = N·λ (K_XX has unit diagonal)
LINEAR_RIDGES = tuple(10.0 ** p for p in np.arange(-3.0, 3.01, 0.5))   # λ / (mean eigenvalue of X̂cᵀX̂c)
PRIOR_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)    # α
LOO_MAX_SHOTS = 3000   # above this many shots, σ/λ/α are chosen on a class-stratified subset
MAX_SHOTS = 16384      # the kernel head's dense N×N solve


@dataclass
class HeadChoice:
    """What LOO chose for one head, and how well it did (recorded in ``svgen.json``)."""

    loo_error: float
    settings: dict
    grid: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"loo_error": self.loo_error, **self.settings}


def prior_scale(F: torch.Tensor) -> float:
    """``s₀ = mean_i (max_c F_ic − mean_c F_ic)``: the spread of the prior's scores over the shots."""
    s = float((F.max(dim=1).values - F.mean(dim=1)).mean())
    return s if s > 1e-12 and math.isfinite(s) else 1.0


def prior_loo(U: torch.Tensor, shrinks: Sequence[torch.Tensor], Y: torch.Tensor, F: torch.Tensor,
              alphas: Sequence[float], intercept: bool = False):
    """Exact LOO of ``Ŷ = αF + H(Y − αF)`` for every shrinkage vector and every α.

    ``H = U diag(g) Uᵀ`` (plus ``11ᵀ/N`` with ``intercept``, where U must be orthogonal to 1,
    e.g. from the SVD of centred data). Returns (error, mse) arrays of shape
    (len(shrinks), len(alphas)): the LOO misclassification rate (argmax of the LOO prediction
    against argmax Y) and the mean squared LOO residual.
    """
    N = Y.shape[0]
    truth = Y.argmax(dim=1)
    UY, UF = U.T @ Y, U.T @ F
    U2 = U * U
    err = np.zeros((len(shrinks), len(alphas)))
    mse = np.zeros_like(err)
    for i, g in enumerate(shrinks):
        HY, HF = U @ (g[:, None] * UY), U @ (g[:, None] * UF)
        h = U2 @ g
        if intercept:
            HY, HF, h = HY + Y.mean(dim=0), HF + F.mean(dim=0), h + 1.0 / N
        h = h.clamp(max=1 - 1e-9)[:, None]
        for j, a in enumerate(alphas):
            R = Y - a * F
            loo = a * F + (HY - a * HF - h * R) / (1 - h)
            err[i, j] = float((loo.argmax(dim=1) != truth).double().mean())
            mse[i, j] = float(((Y - loo) ** 2).sum(dim=1).mean())
    return err, mse


def one_se_choice(err: np.ndarray, mse: np.ndarray, n: int) -> tuple:
    """Index into ``err`` (any shape, axes ordered from least to most important smoothness, larger
    index = smoother on every axis but the last) by the one-standard-error rule.

    Among entries with error ≤ best + sqrt(best(1−best)/n), take the smoothest on the leading
    axes (lexicographically largest indices); the last axis (α) is then chosen by lowest error,
    then lowest mse, ties to the larger α.
    """
    best = float(err.min())
    tol = best + math.sqrt(max(best * (1 - best), 1.0 / n) / n)
    lead = err.reshape(-1, err.shape[-1])
    ok = np.flatnonzero((lead <= tol + 1e-12).any(axis=1))
    lead_idx = np.unravel_index(int(ok.max()), err.shape[:-1])
    e, m = err[lead_idx], mse[lead_idx]
    last = min(range(e.shape[0]), key=lambda j: (e[j], m[j], -j))
    return tuple(int(i) for i in lead_idx) + (last,)


def _stratified(labels: np.ndarray, n_max: int, seed: int) -> Optional[np.ndarray]:
    """Indices of at most ``n_max`` shots, the same fraction of each class (None: use them all)."""
    if labels.shape[0] <= n_max:
        return None
    rng = np.random.default_rng(seed)
    keep = []
    frac = n_max / labels.shape[0]
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        keep.append(rng.choice(idx, size=max(1, int(round(frac * len(idx)))), replace=False))
    return np.sort(np.concatenate(keep))


def _alphas(has_unshot: bool) -> tuple:
    return (1.0,) if has_unshot else PRIOR_WEIGHTS


# ----------------------------------------------------------------------------- kernel head

def fit_kernel_head(text: SupportSet, text_votes: Callable[[float], torch.Tensor], shots: SupportSet, n_classes: int,
                    kind: str = "rbf", sigmas: Optional[Sequence[float]] = None, seed: int = 0):
    """(support set, σ, vote weights M×C, HeadChoice) for the kernel vote over ``[text; shots]``.

    ``text_votes(σ)`` returns the text rows' zero-shot vote weights at bandwidth σ (the
    classifier re-solves them with its own λ rule, or returns the stored ones at its own σ).
    ``sigmas`` defaults to :data:`SIGMA_FACTORS` × the median distance between shots.
    """
    X = shots.rows.double()
    N = X.shape[0]
    if N > MAX_SHOTS:
        from .errors import SvgenError
        raise SvgenError(f"{N} shots: the kernel head solves an N×N system and takes at most {MAX_SHOTS}")
    Y = shots.one_hot(n_classes)
    T = text.rows.double()
    labels = shots.labels.numpy()
    sub = _stratified(labels, LOO_MAX_SHOTS, seed)
    Xs, Ys = (X, Y) if sub is None else (X[sub], Y[sub])
    n = Xs.shape[0]
    if sigmas is None:
        med = median_heuristic(X.float(), seed=seed)
        sigmas = [f * med for f in SIGMA_FACTORS]
    alphas = _alphas(bool((shots.counts(n_classes) == 0).any()))
    ridges = KERNEL_RIDGES
    err = np.zeros((len(sigmas), len(ridges), len(alphas)))
    mse = np.zeros_like(err)
    for i, sigma in enumerate(sigmas):
        F = kernel(Xs, T, sigma, kind) @ text_votes(sigma).double()
        F = F / prior_scale(F)
        e, U = torch.linalg.eigh(kernel(Xs, Xs, sigma, kind))
        e = e.clamp_min(0)
        # c is in units of n (c = n·λ); the full solve uses the same λ
        err[i], mse[i] = prior_loo(U, [e / (e + c * n / N) for c in ridges], Ys, F, alphas)
    i, j, a = one_se_choice(err, mse, n)
    sigma, c, alpha = float(sigmas[i]), float(ridges[j]), float(alphas[a])
    A_T = text_votes(sigma).double()
    F = kernel(X, T, sigma, kind) @ A_T
    s0 = prior_scale(F)
    K = kernel(X, X, sigma, kind)
    K.diagonal().add_(c)
    B = torch.cholesky_solve(Y - alpha * F / s0, torch.linalg.cholesky(K))
    votes = torch.cat([alpha * A_T, s0 * B]).float()
    choice = HeadChoice(float(err[i, j, a]), {"sigma": sigma, "ridge_lambda": c / N, "ridge_c": c,
                                              "prior_weight": alpha, "prior_scale": s0,
                                              "loo_shots": n, "rule": "1-SE (largest σ, then λ)"},
                        grid=[{"sigma": float(s), "c": float(r), "alpha": float(al), "loo_error": float(err[p, q, t])}
                              for p, s in enumerate(sigmas) for q, r in enumerate(ridges) for t, al in enumerate(alphas)])
    return text.join(shots), sigma, votes, choice


# ----------------------------------------------------------------------------- linear head

def fit_linear_head(weight: torch.Tensor, bias: torch.Tensor, shots: SupportSet, n_classes: int):
    """(W, b, HeadChoice): ridge of Y on the shots towards the text head (W_T, b_T), λ and α by LOO."""
    X = shots.rows.double()
    N, D = X.shape
    Y = shots.one_hot(n_classes)
    W_T, b_T = weight.double(), bias.double()
    F = X @ W_T.T + b_T
    s0 = prior_scale(F)
    Ft = F / s0
    mean = X.mean(dim=0)
    Xc = X - mean
    U, s, Vh = torch.linalg.svd(Xc, full_matrices=False)
    keep = s > s.max() * 1e-10 if s.numel() else s > 0
    U, s, Vh = U[:, keep], s[keep], Vh[keep]
    unit = float((s ** 2).sum()) / D or 1.0        # mean eigenvalue of X̂cᵀX̂c
    lams = [r * unit for r in LINEAR_RIDGES]
    alphas = _alphas(bool((shots.counts(n_classes) == 0).any()))
    err, mse = prior_loo(U, [s ** 2 / (s ** 2 + lam) for lam in lams], Y, Ft, alphas, intercept=True)
    j, a = one_se_choice(err, mse, N)
    lam, alpha = lams[j], float(alphas[a])
    R = Y - alpha * Ft
    dW = (Vh.T @ ((s / (s ** 2 + lam))[:, None] * (U.T @ (R - R.mean(dim=0))))).T      # C×D
    db = R.mean(dim=0) - mean @ dW.T
    W = (alpha * W_T + s0 * dW).float()
    b = (alpha * b_T + s0 * db).float()
    choice = HeadChoice(float(err[j, a]), {"ridge_lambda": float(lam), "ridge_relative": float(LINEAR_RIDGES[j]),
                                           "prior_weight": alpha, "prior_scale": s0, "rule": "1-SE (largest λ)"},
                        grid=[{"lambda_relative": float(r), "alpha": float(al), "loo_error": float(err[p, t])}
                              for p, r in enumerate(LINEAR_RIDGES) for t, al in enumerate(alphas)])
    return W, b, choice
