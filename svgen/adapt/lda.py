"""The LDA head: shared-covariance LDA on the shots with the text prototypes as prior means, (γ, κ) by exact
leave-one-out (docs/fewshot.md, "The LDA head"); and the linear head on it: CLIP's zero-shot logits plus α·s × the
LDA head's (GDA's form), one matrix ``W = τP̂ + α·s·W_lda``, ``b = α·s·b_lda``, α on the kernel head's balanced folds
(docs/fewshot.md, "The linear head")."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
import torch

from svgen.adapt import temperatures as calibration
from svgen.core.support import SupportSet
from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen.adapt.config import AdaptConfig, config_or_default
from svgen.adapt.select import behind, paired
from svgen.adapt.heldout import shot_sample
from svgen.state import LdaPart, LinearForm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LdaChoice:
    """The LDA head's (γ, κ) and its leave-one-out error (its means at one Mahalanobis radius)."""

    shrinkage: float
    prior_shots: float
    loo_error: float
    one_shot: bool = False

    def record(self) -> dict:
        return {"loo_error": self.loo_error, "kind": "lda", "shrinkage": self.shrinkage,
                "prior_shots": self.prior_shots, "means": "equal Mahalanobis radius",
                "rule": "one shot per class: Σ = τI and κ = lda_prior_one_shot (LOO cannot judge κ)" if self.one_shot
                else "the most shrinkage not behind the lowest LOO error (paired), then the lowest LOO error"}


def paired_choice(err: np.ndarray, margin: np.ndarray, correct: np.ndarray, level: float) -> tuple:
    """(a, b) into ``err`` (γ × κ): the most shrinkage not behind the lowest error, then its lowest error (paired)."""
    best = min(np.ndindex(err.shape), key=lambda ij: (err[ij], margin[ij], ij))
    ok = np.reshape([not behind(paired(c, correct[best]), level) for c in correct.reshape(-1, correct.shape[-1])],
                    err.shape)
    a = int(np.flatnonzero(ok.any(axis=1)).max())
    b = min(np.flatnonzero(ok[a]), key=lambda j: (err[a, j], margin[a, j], -j))
    return a, int(b)


def prior_means(prototypes: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Text prototypes moved onto the images (the modality gap): ``m_c = p̂_c − mean_c p̂_c + mean_i x_i``."""
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1)
    return P - P.mean(dim=0) + X.mean(dim=0)


def lda_loo_scores(X: torch.Tensor, y: torch.Tensor, m: torch.Tensor, gammas: Sequence[float],
                   kappas: Sequence[float], score_rows=None):
    """Yields ``((a, b), N×C logits)`` for each (γ_a, κ_b): the LDA head's exact leave-one-out (Sherman–Morrison), its
    means at one Mahalanobis radius (:func:`lda_head_weights` with ``equal_radius``, the head svgen fits);
    ``score_rows`` (indices, numpy or torch): only these shots left out and scored (every shot still fits)."""
    N, D = X.shape
    C = m.shape[0]
    n = torch.bincount(y, minlength=C).to(X.dtype)
    sums = torch.zeros(C, D, dtype=X.dtype).index_add_(0, y, X)
    xbar = sums / n.clamp_min(1)[:, None]
    R = X - xbar[y]
    omega, V = (torch.from_numpy(a) for a in np.linalg.eigh((R.T @ R).numpy()))   # numpy's LAPACK: ~2.5× faster
    omega = omega.clamp_min(0)
    centre = X.mean(dim=0) @ V
    C_shot, trace = int((n > 0).sum()), float(omega.sum())
    df = {True: max(N - 1 - C_shot, 1), False: max(N - C_shot, 1)}   # S_w's df without shot i: its class kept or not
    tau = trace / (df[False] * D) if trace > 0 else 1.0
    if score_rows is not None:
        idx = torch.as_tensor(score_rows, dtype=torch.long)
        X, R, y, N = X[idx], R[idx], y[idx], int(idx.numel())
    Xv, xbar_v, m_v, U = X @ V, xbar @ V, m @ V, R @ V
    E = Xv - centre
    n_i = n[y]
    many = n_i > 1                                     # leaving i out keeps class y_i in the data
    scale = torch.where(many, n_i / (n_i - 1).clamp_min(1), torch.zeros_like(n_i))
    own_sum = sums[y] @ V - Xv                         # class sum without shot i (eigenbasis)
    rows = torch.arange(N)
    for a, g in enumerate(gammas):
        binv = {f: 1.0 / ((1 - g) * omega / df[f] + g * tau) for f in (True, False)}
        Binv = torch.where(many[:, None], binv[True][None], binv[False][None])          # N×D
        beta = (1 - g) * scale / torch.where(many, torch.tensor(float(df[True])), torch.tensor(float(df[False])))
        w = Binv * U
        coef = beta / (1 - beta * (U * w).sum(dim=1))   # Σ_{-i}⁻¹ = B_i⁻¹ + coef_i w_i w_iᵀ
        EB, ew = E * Binv, (E * w).sum(dim=1)
        for b, k in enumerate(kappas):
            mu = (n[:, None] * xbar_v + k * m_v) / (n + k).clamp_min(1e-12)[:, None]
            mu[n == 0] = m_v[n == 0]                   # a class without shots: its prior mean, as in the head
            own = (own_sum + k * m_v[y]) / (n_i - 1 + k).clamp_min(1e-12)[:, None]
            own[~many] = m_v[y[~many]]                 # the class's only shot left out: its prior mean
            Dm, Do = mu - centre, own - centre
            WD, wo = w @ Dm.T, (w * Do).sum(dim=1)
            q = torch.where(many[:, None], ((Dm * Dm) @ binv[True])[None], ((Dm * Dm) @ binv[False])[None])
            num = EB @ Dm.T + coef[:, None] * ew[:, None] * WD
            den = q + coef[:, None] * WD * WD
            num[rows, y] = (EB * Do).sum(dim=1) + coef * ew * wo
            den[rows, y] = (Do * Do * Binv).sum(dim=1) + coef * wo * wo
            norm = den.clamp_min(1e-300).sqrt()
            yield (a, b), norm.mean(dim=1, keepdim=True) * num / norm


def lda_loo(X: torch.Tensor, y: torch.Tensor, m: torch.Tensor, gammas: Sequence[float], kappas: Sequence[float],
            score_rows=None) -> tuple:
    """(error γ×κ, mean negative margin γ×κ, correct γ×κ×N) of :func:`lda_loo_scores`."""
    t = y if score_rows is None else y[torch.as_tensor(score_rows, dtype=torch.long)]   # the scored shots' labels
    err, tie = np.zeros((len(gammas), len(kappas))), np.zeros((len(gammas), len(kappas)))
    correct = np.zeros(err.shape + (len(t),), dtype=bool)
    for ab, sc in lda_loo_scores(X, y, m, gammas, kappas, score_rows):
        correct[ab] = (sc.argmax(dim=1) == t).numpy()
        err[ab] = float((~correct[ab]).mean())
        other = sc.scatter(1, t[:, None], -float("inf")).max(dim=1).values
        tie[ab] = float((other - sc[torch.arange(len(t)), t]).clamp(-1e6, 1e6).mean())
    return err, tie, correct


def lda_loo_logits(prototypes: torch.Tensor, shots, n_classes: int, shrinkage: float, prior_shots: float,
                   rows=None) -> torch.Tensor:
    """The LDA head's exact leave-one-out logits (N×C, or those of ``rows``) at (γ, κ)."""
    X = shots.rows.double()
    return next(lda_loo_scores(X, shots.labels, prior_means(prototypes, X), [shrinkage], [prior_shots], rows))[1]


def lda_covariance(X, y, n_classes: int, gamma: float, tau: Optional[float] = None) -> torch.Tensor:
    """``Σ = (1−γ) S_w/df + γ τ I`` (the identity where there is no scatter)."""
    N, D = X.shape
    n = torch.bincount(y, minlength=n_classes).double()
    xbar = torch.zeros(n_classes, D, dtype=X.dtype).index_add_(0, y, X) / n.clamp_min(1)[:, None]
    R = X - xbar[y]
    S = R.T @ R / max(N - int((n > 0).sum()), 1)
    if tau is None:
        tau = float(torch.diagonal(S).sum()) / D
    Sigma = (1 - gamma) * S + gamma * tau * torch.eye(D, dtype=X.dtype)
    return torch.eye(D, dtype=X.dtype) if float(torch.diagonal(Sigma).sum()) <= 0 else Sigma


def lda_head_weights(X, y, m, gamma: float, kappa: float, tau: Optional[float] = None, equal_radius: bool = False,
                     centre: Optional[torch.Tensor] = None):
    """(W C×D, b C): LDA with means ``(n_c x̄_c + κ m_c)/(n_c + κ)``, optionally at one radius from ``centre``."""
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


def fit_lda_head(prototypes: torch.Tensor, shots: SupportSet, n_classes: int, config: Optional[AdaptConfig] = None):
    """(W, b, :class:`LdaChoice`): the LDA head at (γ, κ) by :func:`paired_choice` on :func:`lda_loo`."""
    config = config_or_default(config)
    X, y = shots.rows.double(), shots.labels
    m = prior_means(prototypes, X)
    counts = shots.counts(n_classes)
    single = bool((counts <= 1).all())
    kappas = ((config.lda_prior_one_shot,) if single
              else tuple(k for k in config.lda_prior if k > 0 or not (counts == 0).any()))   # κ = 0 needs every class
    gammas = (1.0,) if single else config.lda_shrinkage     # no within-class scatter to estimate with 1 shot
    sub = shot_sample(y.numpy(), config.lda_loo_max, 0)
    err, tie, correct = lda_loo(X, y, m, gammas, kappas, score_rows=sub)
    a, b = paired_choice(err, tie, correct, config.level)
    W, bias = lda_head_weights(X, y, m, gammas[a], kappas[b], equal_radius=True)
    return W.float(), bias.float(), LdaChoice(float(gammas[a]), float(kappas[b]), float(err[a, b]), single)


@dataclass
class LinearFit:
    """The linear head ``x̂ Wᵀ + b``, its LDA part, its record, its logits on the folds' held-out shots and its exact
    LOO logits."""

    weight: torch.Tensor
    bias: torch.Tensor
    lda: LdaPart
    record: dict
    held_logits: Optional[np.ndarray] = None
    loo_logits: Optional[np.ndarray] = None
    loo_labels: Optional[np.ndarray] = None
    loo_rows: Optional[np.ndarray] = None       # None: all shots


def spread_ratio(zero_shot: np.ndarray, lda_logits: np.ndarray) -> float:
    """``s = std(Z − row means) / std(L − row means)`` on the same images (no labels)."""
    zc = zero_shot - zero_shot.mean(axis=1, keepdims=True)
    lc = lda_logits - lda_logits.mean(axis=1, keepdims=True)
    return float(np.std(zc) / max(float(np.std(lc)), 1e-12))


def fit_linear_head(prototypes: torch.Tensor, shots, n_classes: int, W_lda: torch.Tensor, b_lda: torch.Tensor,
                    choice: LdaChoice, folds: Optional[list], pool: Optional[np.ndarray],
                    loo_rows: Optional[np.ndarray], config: Optional[AdaptConfig] = None) -> LinearFit:
    """The linear head on the LDA head at ``choice``: α on ``folds``' scored shots (``(removed, scored)`` pairs, LDA
    refitted on ``pool`` minus each fold's removed shots), or LDA."""
    config = config_or_default(config)
    X, y, scored = shots.rows.double(), shots.labels, slice(None) if loo_rows is None else loo_rows
    loo = lda_loo_logits(prototypes, shots, n_classes, choice.shrinkage, choice.prior_shots,
                             rows=loo_rows).numpy()
    loo_y, Xn = y.numpy()[scored], X.numpy()
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1).numpy()
    Z_loo = CLIP_LOGIT_SCALE * Xn[scored] @ P.T
    s = spread_ratio(Z_loo, loo)
    t_lda = calibration.loo_temperatures({"lda": loo}, loo_y, fallback={"lda": 1.0})
    fitted = bool(t_lda["loo"]["lda"]["fitted"])
    part = LdaPart(W_lda, b_lda, choice.shrinkage, float(t_lda["temperatures"]["lda"]) if fitted else None)
    if folds is None:
        return LinearFit(W_lda, b_lda, replace(part, form=LinearForm.LDA), {"form": "lda", "scale": s,
                                        "rule": "one shot per class: no held-out folds to weigh the LDA logits "
                                                "against the zero-shot ones; the LDA head"},
                         loo_logits=loo, loo_labels=loo_y, loo_rows=loo_rows)
    rows = np.concatenate([scored for _, scored in folds])
    m, out = prior_means(prototypes, X), []
    for removed, scored in folds:
        keep = torch.from_numpy(np.setdiff1d(np.arange(len(y)) if pool is None else pool, removed))
        W, b = lda_head_weights(X[keep], y[keep], m, choice.shrinkage, choice.prior_shots, equal_radius=True)
        out.append((X[scored] @ W.T + b).numpy())
    L = np.concatenate(out)
    Z = CLIP_LOGIT_SCALE * Xn[rows] @ P.T
    s_fold = spread_ratio(Z, L)
    truth, alphas = y.numpy()[rows], config.alphas
    acc = np.array([((Z + a * s_fold * L).argmax(axis=1) == truth).mean() for a in alphas])
    i = int(np.argmax(acc))      # the first best: ties to the smaller α
    alpha = alphas[i]
    W = CLIP_LOGIT_SCALE * torch.from_numpy(P) + alpha * s * W_lda.double()
    b = alpha * s * b_lda.double()
    record = {"form": "zero-shot logits + α·s·LDA logits", "alpha": float(alpha), "scale": s, "fold_scale": s_fold,
              "lda_temperature": float(t_lda["temperatures"]["lda"]), "lda_temperature_fitted": fitted,
              "held_out_accuracy": float(acc[i]), "zero_shot_held_out_accuracy": float(acc[0]),
              "grid": {f"{a:g}": float(v) for a, v in zip(alphas, acc)}, "shots_compared": int(rows.size),
              "rule": "α with the best accuracy on the balanced folds' held-out shots (the LDA head refitted without "
                      "each fold, its logits scaled by fold_scale), ties to the smaller α; a scale is the spread of the "
                      "zero-shot logits / the spread of the LDA logits on shots that head did not see (the deployed "
                      "head's: its exact leave-one-out logits)"}
    log.info("linear head: zero-shot logits + %g·%.3g·LDA (held-out accuracy %.3f, zero-shot %.3f)",
             alpha, s, acc[i], acc[0])
    return LinearFit(W.float(), b.float(), part, record, Z + alpha * s_fold * L, Z_loo + alpha * s * loo, loo_y,
                     loo_rows)

