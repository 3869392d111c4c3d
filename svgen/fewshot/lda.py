"""Labelled images ("shots") in the linear head: shared-covariance LDA chosen by exact leave-one-out.

The linear head is closed-form and leans on the zero-shot (text) side as a prior: shared-covariance LDA on the shots
with the text prototypes as prior means, ``μ_c = (n_c x̄_c + κ m_c)/(n_c + κ)`` (``m_c`` the prototype moved onto the
shots' centre x̄, :func:`prior_means`) and ``Σ = (1−γ) S_w/(N−C) + γ τ I`` (within-class scatter shrunk towards its
mean eigenvalue τ), with the means put at one Mahalanobis radius from x̄:
``logits_c(x) = r (x̂ − x̄)ᵀ Σ⁻¹ d_c / ||d_c||_Σ⁻¹``, ``d_c = μ_c − x̄`` (:func:`lda_head_weights`; with one shot per
class, SimpleShot's centred-and-renormalised nearest mean).

γ and κ are chosen by exact leave-one-out over the shots (image to image): the LOO downdates the class mean and the
scatter matrix by rank one (:func:`lda_loo`), so each left-out shot is scored against all classes by the head fitted
on every other shot; above :data:`LDA_LOO_MAX` shots a sample of shots spread over the classes is scored. The rule
is the one-standard-error rule towards the smoother model: among settings whose LOO error is within one binomial
standard error of the best, the most shrinkage. Shots in the benchmark are averages of augmented views, tighter
than single-crop queries; the plain LOO minimum then prefers too little (docs/fewshot.md).

The kernel head with shots is :mod:`svgen.fewshot.residual` (zero-shot probabilities plus a kernel ridge on their
residual). Classes without shots cannot be judged by LOO; when there are any, κ = 0 is not offered.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from svgen.core.support import SupportSet

log = logging.getLogger(__name__)


@dataclass
class HeadChoice:
    """What LOO chose for one head, and how well it did (recorded in ``svgen.json``)."""

    loo_error: float
    settings: dict
    grid: list = field(default_factory=list)
    loo_correct: Optional[np.ndarray] = None          # per shot: is its LOO prediction right (chosen settings)
    loo_correct_images: Optional[np.ndarray] = None   # the same with the prior off (α = 0 / κ = 0)
    loo_rows: Optional[np.ndarray] = None             # which shots those are (None: all of them)

    def as_dict(self) -> dict:
        return {"loo_error": self.loo_error, **self.settings}


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


def _eigh(A: torch.Tensor):
    """``torch.linalg.eigh`` through numpy's LAPACK: the same decomposition, measured here at 1,600 shots
    with about 2.5× less CPU time than torch's (benchmarks/bench_fit_time.py)."""
    e, U = np.linalg.eigh(A.numpy())
    return torch.from_numpy(e), torch.from_numpy(U)


LDA_LOO_MAX = 512    # shots scored by the LOO that chooses γ and κ (a sample spread over the classes above this)
LDA_SHRINKAGE = (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)     # γ: Σ = (1−γ)·S_w/df + γ·(tr/D)·I
LDA_PRIOR = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)          # κ: prior shots on each class mean
# κ with one shot per class, where LOO cannot judge it: leaving a class's only shot out leaves that class
# its prior alone while every other class keeps its shot, so LOO favours κ = 0 (measured on the CoOp sets
# with leak-free stand-in prototypes: κ = 0 fell 12–38 points below the prototypes alone). The CLIP paper
# (Radford et al. 2021, fig. 7) finds zero-shot CLIP worth about a 4-shot linear probe on average:
# the text prior counts as 4 shots.
LDA_PRIOR_ONE_SHOT = 4.0


def prior_means(prototypes: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Text prototypes moved onto the images: ``m_c = p̂_c − mean_c p̂_c + mean_i x̂_i``.

    CLIP's image and text embeddings sit in two cones (the modality gap); shifting the text
    cloud's centre onto the shots' centre keeps the prototypes' relative geometry.
    """
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1)
    return P - P.mean(dim=0) + X.mean(dim=0)


def lda_loo(X: torch.Tensor, y: torch.Tensor, m: torch.Tensor, gammas: Sequence[float], kappas: Sequence[float],
            equal_radius: bool = False, return_correct: bool = False, keep_scores: bool = False,
            score_rows: Optional[torch.Tensor] = None):
    """Exact leave-one-out error (and mean negative margin) of shared-covariance LDA with prior means.

    The head for one (γ, κ) is ``scores_c(x) = (x − ½μ_c)ᵀ Σ⁻¹ μ_c`` with
    ``μ_c = (n_c x̄_c + κ m_c)/(n_c + κ)`` and ``Σ = (1−γ) S_w/df + γ τ I``, ``df = N − C``, and the
    shrinkage target ``τ = tr S_w/(df·D)`` of all shots held fixed. With ``equal_radius`` the means
    are first put at one Mahalanobis distance from the shots' centre ``x̄`` (held at its all-shot
    value, like τ: neither uses a label), ``scores_c(x) = r (x − x̄)ᵀ Σ⁻¹ d_c / ||d_c||_Σ⁻¹``,
    ``d_c = μ_c − x̄``, ``r`` the mean of ``||d_c||_Σ⁻¹`` (:func:`lda_head_weights`).
    Leaving shot i (class c, n_c shots) out downdates ``S_w`` by ``n_c/(n_c−1)·u uᵀ`` (``u = x_i − x̄_c``),
    ``df`` by one and ``x̄_c``; in the eigenbasis of ``S_w`` Σ is then diagonal minus a rank-one term,
    inverted by Sherman–Morrison, so every LOO score comes from a few N×C matrix products.
    Returns (error, mean negative margin) arrays of shape (len(gammas), len(kappas)); with
    ``return_correct`` also the per-shot LOO correctness (len(gammas), len(kappas), N); with
    ``keep_scores`` then also ``{(a, b): N×C LOO logits}`` (svgen.calibration.temperatures fits temperatures on them).
    ``score_rows`` (indices): the LOO predictions of those shots only (every shot still fits the head, and each
    is still left out exactly); the cost of the search is linear in their number.
    """
    N, D = X.shape
    C = m.shape[0]
    n = torch.bincount(y, minlength=C).to(X.dtype)
    sums = torch.zeros(C, D, dtype=X.dtype).index_add_(0, y, X)
    xbar = sums / n.clamp_min(1)[:, None]
    R = X - xbar[y]
    omega, V = _eigh(R.T @ R)
    omega = omega.clamp_min(0)
    centre = X.mean(dim=0) @ V
    C_shot = int((n > 0).sum())
    df_all = max(N - C_shot, 1)
    trace = float(omega.sum())
    tau = trace / (df_all * D) if trace > 0 else 1.0
    df = {True: max(N - 1 - C_shot, 1), False: df_all}
    if score_rows is not None:                         # only these shots are left out and scored
        idx = torch.as_tensor(score_rows, dtype=torch.long)
        X, R, y = X[idx], R[idx], y[idx]
        N = int(idx.numel())
    Xv, xbar_v, m_v, U = X @ V, xbar @ V, m @ V, R @ V
    E = Xv - centre
    n_i = n[y]
    many = n_i > 1                                     # leaving i out keeps class y_i in the data
    scale = torch.where(many, n_i / (n_i - 1).clamp_min(1), torch.zeros_like(n_i))
    own_sum = sums[y] @ V - Xv                         # class sum without shot i (eigenbasis)
    rows = torch.arange(N)
    err = np.zeros((len(gammas), len(kappas)))
    tie = np.zeros_like(err)
    kept = {}
    correct = np.zeros(err.shape + (N,), dtype=bool)
    tiny = 1e-300
    for a, g in enumerate(gammas):
        binv = {f: 1.0 / ((1 - g) * omega / df[f] + g * tau) for f in (True, False)}
        Binv = torch.where(many[:, None], binv[True][None], binv[False][None])          # N×D
        beta = (1 - g) * scale / torch.where(many, torch.tensor(float(df[True])), torch.tensor(float(df[False])))
        w = Binv * U
        coef = beta / (1 - beta * (U * w).sum(dim=1))   # Σ_{-i}⁻¹ = B_i⁻¹ + coef_i w_i w_iᵀ
        XB, xw = Xv * Binv, (Xv * w).sum(dim=1)
        EB, ew = E * Binv, (E * w).sum(dim=1)
        for b, k in enumerate(kappas):
            mu = (n[:, None] * xbar_v + k * m_v) / (n + k).clamp_min(1e-12)[:, None]
            mu[n == 0] = m_v[n == 0]                   # a class without shots: its prior mean, as in the head
            own = (own_sum + k * m_v[y]) / (n_i - 1 + k).clamp_min(1e-12)[:, None]
            own[~many] = m_v[y[~many]]                 # the class's only shot left out: its prior mean
            if equal_radius:
                Dm, Do = mu - centre, own - centre
                WD, wo = w @ Dm.T, (w * Do).sum(dim=1)
                q = torch.where(many[:, None], ((Dm * Dm) @ binv[True])[None], ((Dm * Dm) @ binv[False])[None])
                num = EB @ Dm.T + coef[:, None] * ew[:, None] * WD
                den = q + coef[:, None] * WD * WD
                num[rows, y] = (EB * Do).sum(dim=1) + coef * ew * wo
                den[rows, y] = (Do * Do * Binv).sum(dim=1) + coef * wo * wo
                norm = den.clamp_min(tiny).sqrt()
                sc = norm.mean(dim=1, keepdim=True) * num / norm
            else:
                q = torch.where(many[:, None], ((mu * mu) @ binv[True])[None], ((mu * mu) @ binv[False])[None])
                WM = w @ mu.T
                sc = XB @ mu.T - 0.5 * q + coef[:, None] * (xw[:, None] * WM - 0.5 * WM * WM)
                wo = (w * own).sum(dim=1)
                sc[rows, y] = ((Xv - 0.5 * own) * Binv * own).sum(dim=1) + coef * (xw * wo - 0.5 * wo * wo)
            if keep_scores:
                kept[a, b] = sc
            ok = (sc.argmax(dim=1) == y).numpy()
            correct[a, b] = ok
            err[a, b] = float((~ok).mean())
            true = sc[rows, y]
            other = sc.scatter(1, y[:, None], -float("inf")).max(dim=1).values
            tie[a, b] = float((other - true).clamp(-1e6, 1e6).mean())
    out = (err, tie) + ((correct,) if return_correct else ()) + ((kept,) if keep_scores else ())
    return out


def lda_covariance(X, y, n_classes: int, gamma: float, tau: Optional[float] = None) -> torch.Tensor:
    """The LDA head's shared covariance ``Σ = (1−γ) S_w/df + γ τ I`` (identity when there is no scatter)."""
    N, D = X.shape
    n = torch.bincount(y, minlength=n_classes).double()
    xbar = torch.zeros(n_classes, D, dtype=X.dtype).index_add_(0, y, X) / n.clamp_min(1)[:, None]
    R = X - xbar[y]
    df = max(N - int((n > 0).sum()), 1)
    S = R.T @ R / df
    if tau is None:
        tau = float(torch.diagonal(S).sum()) / D
    Sigma = (1 - gamma) * S + gamma * tau * torch.eye(D, dtype=X.dtype)
    if float(torch.diagonal(Sigma).sum()) <= 0:      # one shot per class: no within-class scatter at all
        Sigma = torch.eye(D, dtype=X.dtype)
    return Sigma


def lda_head_weights(X, y, m, gamma: float, kappa: float, tau: Optional[float] = None, equal_radius: bool = False,
                     centre: Optional[torch.Tensor] = None):
    """(W C×D, b C): the LDA head of :func:`lda_loo` on all shots (classes without shots: μ_c = m_c).

    ``tau`` overrides the shrinkage target ``tr S_w/(df·D)`` (LOO holds the all-shot value fixed).
    ``equal_radius``: the means are moved along ``d_c = μ_c − x̄`` to one Mahalanobis distance
    ``r = mean_c ||d_c||_Σ⁻¹`` from the shots' centre ``x̄`` (``centre`` overrides it), so
    ``logits_c = r (x − x̄)ᵀ Σ⁻¹ d_c / ||d_c||_Σ⁻¹``: the Gaussian bias ``−½||d_c||²_Σ⁻¹``, which with
    few shots mostly measures how noisy a class's mean is (``E||x̄_c − x̄||² ⊇ tr Σ/n_c``), drops out.
    With Σ ∝ I and one shot per class this is nearest centred-and-renormalised mean (SimpleShot's CL2N)."""
    C = m.shape[0]
    n = torch.bincount(y, minlength=C).double()
    xbar = torch.zeros(C, X.shape[1], dtype=X.dtype).index_add_(0, y, X) / n.clamp_min(1)[:, None]
    Sigma = lda_covariance(X, y, C, gamma, tau)
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


def fit_lda_head(prototypes: torch.Tensor, shots: SupportSet, n_classes: int, equal_radius: bool = True):
    """(W, b, HeadChoice): shared-covariance LDA on the shots with the text prototypes as prior means.

    Shrinkage γ and prior strength κ are chosen by exact LOO over the shots (:func:`lda_loo`),
    1-SE rule towards more shrinkage; with one shot per class Σ = τI and κ = :data:`LDA_PRIOR_ONE_SHOT`. ``logits = x̂ Wᵀ + b``. ``equal_radius`` (the default) puts
    the class means at one Mahalanobis distance from the shots' centre (:func:`lda_head_weights`).
    """
    X = shots.rows.double()
    y = shots.labels
    m = prior_means(prototypes, X)
    single = bool((shots.counts(n_classes) <= 1).all())
    if single:
        kappas = (LDA_PRIOR_ONE_SHOT,)
    elif (shots.counts(n_classes) == 0).any():
        kappas = tuple(k for k in LDA_PRIOR if k > 0)
    else:
        kappas = LDA_PRIOR
    scored = (0.0,) + kappas if kappas[0] != 0.0 else kappas      # κ = 0 always scored (choose_head)
    offer = [scored.index(k) for k in kappas]
    gammas = (1.0,) if single else LDA_SHRINKAGE     # no within-class scatter to estimate with 1 shot
    from svgen.selection import shot_sample

    sub = shot_sample(y.numpy(), LDA_LOO_MAX, 0)   # the search scores at most LDA_LOO_MAX shots, spread over classes
    err, tie, correct = lda_loo(X, y, m, gammas, scored, equal_radius=equal_radius, return_correct=True,
                                score_rows=None if sub is None else torch.from_numpy(sub))
    a, b = one_se_choice(err[:, offer], tie[:, offer], X.shape[0] if sub is None else len(sub))
    b = offer[b]
    W, bias = lda_head_weights(X, y, m, gammas[a], scored[b], equal_radius=equal_radius)
    choice = HeadChoice(float(err[a, b]), {"kind": "lda", "shrinkage": float(gammas[a]), "prior_shots": float(scored[b]),
                                           "means": "equal Mahalanobis radius" if equal_radius else "LDA",
                                           "rule": "one shot per class: Σ = τI and κ = LDA_PRIOR_ONE_SHOT (LOO cannot "
                                                   "judge κ)" if single else "1-SE (most shrinkage), then lowest LOO error"},
                        grid=[{"shrinkage": float(g), "prior_shots": float(scored[q]), "loo_error": float(err[p, q])}
                              for p, g in enumerate(gammas) for q in offer],
                        loo_correct=correct[a, b], loo_correct_images=correct[a, 0])
    return W.float(), bias.float(), choice
