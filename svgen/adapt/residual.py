"""The kernel head with shots, ``s(x) = p₀(x) + k(x̂, X)(K + cI)⁻¹(Y − p₀(X))``: σ and c on balanced folds, kept
unless behind zero-shot there (docs/fewshot.md, "The kernel head")."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen.adapt.config import AdaptConfig, config_or_default
from svgen.adapt.select import Decision, ShotReason, shot_test
from svgen.adapt.heldout import balanced_folds, scored_folds, shot_sample

log = logging.getLogger(__name__)

COINCIDENT = 1e-10   # squared distance below which two unit shots are the same image (duplicate files)
ONE_SHOT_RULE = "one shot per class: leave-one-out would leave the image's class without any shot, so it cannot " \
                "judge the correction"


@dataclass
class Selection:
    """σ, c and their record; the folds ((removed, scored) pairs; None: one shot per class) with the head's scores
    at the scored shots, else LOO scores."""

    sigma: float
    ridge_c: float
    record: dict
    loo: Optional[np.ndarray] = None
    folds: Optional[list] = None
    held_rows: Optional[np.ndarray] = None
    held_scores: Optional[np.ndarray] = None
    p0_held: Optional[np.ndarray] = None

    @property
    def one_shot(self) -> bool:
        return self.folds is None


@dataclass
class ResidualFit:
    """The kernel head ``s(x) = p₀(x) + k(x̂, rows) @ votes``, its decision and evidence."""

    decision: Decision
    rows: np.ndarray
    labels: np.ndarray
    sigma: float
    votes: np.ndarray
    logit_scale: float
    loo_scores: Optional[np.ndarray]    # leave-one-out scores of the (scored) shots, with one shot per class
    loo_rows: Optional[np.ndarray]      # which shots those are (None: all)
    record: dict
    held_rows: Optional[np.ndarray] = None
    held_scores: Optional[np.ndarray] = None
    folds: Optional[list] = None

    @property
    def adopted(self) -> bool:
        return self.decision.kept


def unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def prior_probs(X: np.ndarray, P: np.ndarray, logit_scale: float = CLIP_LOGIT_SCALE) -> np.ndarray:
    """``p₀ = softmax(τ · x̂ P̂ᵀ)`` (N×C, computed in place)."""
    z = logit_scale * X @ P.T
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def residuals(X: np.ndarray, y: np.ndarray, P: np.ndarray, C: int, logit_scale: float) -> np.ndarray:
    """``R = Y − p₀`` (N×C), built in place of p₀."""
    R = prior_probs(X, P, logit_scale)
    R *= -1.0
    R[np.arange(len(y)), y] += 1.0
    return R


def rbf(A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
    """``exp(−||a − b||²/(2σ²))`` for unit rows."""
    return np.exp(-np.maximum(2.0 - 2.0 * (A @ B.T), 0.0) / (2.0 * sigma * sigma))


def median_distance(X: np.ndarray, seed: int = 0, n_max: int = 1024) -> Optional[float]:
    """The median distance between two different shots (at most ``n_max``, seeded); None when no two differ."""
    rng = np.random.default_rng(seed)
    Z = X if X.shape[0] <= n_max else X[rng.choice(X.shape[0], n_max, replace=False)]
    d2 = np.maximum(2.0 - 2.0 * Z @ Z.T, 0.0)[np.triu_indices(Z.shape[0], 1)]
    d2 = d2[d2 > COINCIDENT]
    return float(np.sqrt(np.median(d2))) if d2.size else None


def loo_scores(U: np.ndarray, e: np.ndarray, c: float, R: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """Exact leave-one-out scores ``p₀ + (HR − h ⊙ R)/(1 − h)`` of ``H = K(K + cI)⁻¹``, ``K = U diag(e) Uᵀ``."""
    g = e / (e + c)
    HR = U @ (g[:, None] * (U.T @ R))
    h = np.minimum((U * U) @ g, 1 - 1e-9)
    return p0 + (HR - h[:, None] * R) / (1 - h[:, None])


def select(X: np.ndarray, y: np.ndarray, P: np.ndarray, C: int, logit_scale: float, seed: int = 0,
           config: Optional[AdaptConfig] = None) -> Selection:
    """σ × c with the best accuracy on balanced folds (ties: larger c, then σ); one shot per class: Tip-Adapter's."""
    config = config_or_default(config)
    R = residuals(X, y, P, C, logit_scale)
    big = X.shape[0] > config.select_max
    p0 = None if big else prior_probs(X, P, logit_scale)
    d2 = None if big else np.maximum(2.0 - 2.0 * X @ X.T, 0.0)
    one_shot = np.bincount(y, minlength=C).max() <= 1
    med = None if one_shot else median_distance(X, seed)
    if med is None:
        sigma, c = 1.0 / math.sqrt(config.one_shot_beta), config.one_shot_ridge
        what = "one shot per class" if one_shot else "every shot is the same image"
        e, U = (None, None) if big else np.linalg.eigh(np.exp(-d2 / (2 * sigma * sigma)))
        return Selection(sigma, c, {"one_shot": True, "rule": f"{what}: σ = 1/√β (Tip-Adapter's β = 5.5), c = 1 (the "
                                    "shot and the text weigh the same); the labels cannot identify either"},
                         None if big else loo_scores(U, np.maximum(e, 0.0), c, R, p0))
    folds = scored_folds(balanced_folds(y, seed, config.max_folds), y, seed, config.select_max)
    held = np.concatenate([scored for _, scored in folds])
    p0_held = np.eye(C)[y[held]] - R[held] if p0 is None else p0[held]
    sigmas, ridges = [f * med for f in config.sigma_factors], config.ridges
    cells = (nystrom_fold_scores(X, y, R, p0_held, folds, sigmas, ridges, seed, config.select_basis) if big
             else dense_fold_scores(d2, y, R, p0, folds, sigmas, ridges).items())
    acc, best = {}, None   # only the best cell's scores are kept (40 of them at 1,024 × 1,000 are 330 MB)
    for (i, j), sc in cells:
        acc[i, j] = (sc.argmax(axis=1) == y[held]).mean()
        if best is None or (acc[i, j], ridges[j], i) > (acc[best[0]], ridges[best[0][1]], best[0][0]):
            best = (i, j), sc
    (i, j), best_scores = best
    record = {"one_shot": False, "sigma_factor": config.sigma_factors[i], "median_distance": med,
              "held_out_accuracy": float(acc[i, j]), "folds": len(folds),
              **({"refits": f"Nyström basis of {config.select_basis} shots, every class"} if big else {}),
              "rule": "σ (× the median shot distance) and c with the best accuracy on held-out shots (balanced folds, "
                      "the deployed predictor); ties to the larger c, then σ"}
    return Selection(sigmas[i], ridges[j], record, None, folds, held, best_scores, p0_held)


def dense_fold_scores(d2: np.ndarray, y: np.ndarray, R: np.ndarray, p0: np.ndarray, folds: list, sigmas, ridges):
    """{(i, j): H×C scores at the scored shots}: the head refitted without each fold, one eigh per (σ, fold)."""
    parts = {}
    for removed, scored in folds:
        keep = np.setdiff1d(np.arange(len(y)), removed)
        for i, sigma in enumerate(sigmas):
            e, U = np.linalg.eigh(np.exp(-d2[np.ix_(keep, keep)] / (2 * sigma * sigma)))
            e, UR, Kh = np.maximum(e, 0.0), U.T @ R[keep], np.exp(-d2[np.ix_(scored, keep)] / (2 * sigma * sigma))
            KU = Kh @ U
            for j, c in enumerate(ridges):
                parts.setdefault((i, j), []).append(p0[scored] + KU @ (UR / (e + c)[:, None]))
    return {k: np.concatenate(v) for k, v in parts.items()}


def nystrom_fold_scores(X: np.ndarray, y: np.ndarray, R: np.ndarray, p0_held: np.ndarray, folds: list, sigmas,
                        ridges, seed: int = 0, basis_size: int = 1024):
    """As :func:`dense_fold_scores` in a Nyström basis of ``basis_size`` shots a fold keeps
    (:func:`~svgen.adapt.heldout.shot_sample`; a removed shot as a centre would leave its direction without data), with
    features ``A = k(X, L) K_LL^{-1/2}``: the fold's refit solves ``(A_keepᵀA_keep + cI) β = A_keepᵀR_keep``, one
    eigendecomposition per (σ, fold) for every c (docs/fewshot.md); each ``((i, j), scores)`` yielded as computed."""
    kept = []
    for removed, scored in folds:   # per fold: the shots it keeps, its basis, their squared distances
        keep = np.setdiff1d(np.arange(len(y)), removed)
        pick = shot_sample(y[keep], basis_size, seed)
        basis = keep if pick is None else keep[pick]
        rows = np.concatenate([keep, scored])
        d2 = X[rows] @ X[basis].T
        np.maximum(np.add(np.multiply(d2, -2.0, out=d2), 2.0, out=d2), 0.0, out=d2)
        kept.append((keep.size, torch.from_numpy(R[keep].astype(np.float32)), d2, np.searchsorted(keep, basis)))
    for i, sigma in enumerate(sigmas):
        parts = [[] for _ in ridges]
        start = 0
        for (n_keep, R_keep, d2, at), (_, scored) in zip(kept, folds):
            lam, Q = np.linalg.eigh(np.exp(d2[at] * (-0.5 / (sigma * sigma))))
            ok = lam > 1e-10 * lam.max()
            K, T = np.exp(d2 * (-0.5 / (sigma * sigma))), Q[:, ok] / np.sqrt(lam[ok])    # kept rows, then scored
            e, V = np.linalg.eigh(T.T @ (K[:n_keep].T @ K[:n_keep]) @ T)
            AV = torch.from_numpy(K.astype(np.float32)) @ torch.from_numpy((T @ V).astype(np.float32))
            VB = AV[:n_keep].T @ R_keep
            AS, e = AV[n_keep:], torch.from_numpy(np.maximum(e, 0.0).astype(np.float32))
            for j, c in enumerate(ridges):
                parts[j].append(p0_held[start:start + scored.size] + ((AS / (e + c)) @ VB).numpy())
            start += scored.size
        for j in range(len(ridges)):
            yield (i, j), np.concatenate(parts[j])


def solve(X: np.ndarray, y: np.ndarray, P: np.ndarray, C: int, sigma: float, c: float, logit_scale: float,
          seed: int = 0, config: Optional[AdaptConfig] = None):
    """The votes ``(K + cI)⁻¹ (Y − p₀)`` (N×C), above dense_max in a stratified Nyström basis (the others' votes 0)."""
    config = config_or_default(config)
    R = residuals(X, y, P, C, logit_scale)
    if X.shape[0] <= config.dense_max:
        K = rbf(X, X, sigma)
        K[np.diag_indices_from(K)] += c
        return np.linalg.solve(K, R)
    rng = np.random.default_rng(seed)   # the basis: the same fraction of each class
    frac = min(config.nystrom_basis / X.shape[0], 1.0)
    basis = np.sort(np.concatenate([rng.choice(idx, size=max(1, int(frac * len(idx))), replace=False)
                                    for idx in (np.flatnonzero(y == c) for c in np.unique(y))]))
    L = X[basis]
    K_LX = rbf(L, X, sigma)
    A = K_LX @ K_LX.T + c * rbf(L, L, sigma)
    A[np.diag_indices_from(A)] += 1e-8 * float(np.trace(A)) / A.shape[0]
    V = np.zeros_like(R)
    V[basis] = np.linalg.solve(A, K_LX @ R)
    return V


def fit_residual_head(X, y, P, n_classes: int, logit_scale: float = CLIP_LOGIT_SCALE, seed: int = 0,
                      config: Optional[AdaptConfig] = None) -> ResidualFit:
    """The kernel head: :func:`select`, :func:`~svgen.adapt.select.shot_test` against zero-shot, :func:`solve`."""
    config = config_or_default(config)
    X, P, y = unit(X), unit(P), np.asarray(y, dtype=np.int64)
    one_shot = np.bincount(y, minlength=n_classes).max() <= 1
    sub = shot_sample(y, config.select_max, seed) if one_shot else None
    Xs, ys = (X, y) if sub is None else (X[sub], y[sub])
    sel = select(Xs, ys, P, n_classes, logit_scale, seed, config)
    if sel.one_shot:
        decision = Decision(True, ShotReason.NO_EVIDENCE, level=config.level)
        decision_record = {"adopted": True, "rule": ONE_SHOT_RULE}
    else:
        truth = ys[sel.held_rows]
        decision = shot_test(sel.held_scores.argmax(axis=1) == truth, sel.p0_held.argmax(axis=1) == truth,
                             level=config.level)
        decision_record = decision.to_json()
    record = {"sigma": float(sel.sigma), "ridge_c": float(sel.ridge_c), "logit_scale": float(logit_scale),
              "selection": sel.record, "decision": decision_record, "shots": int(X.shape[0]),
              "scored_shots": int(Xs.shape[0])}
    if decision.kept:   # every shot a row (above dense_max those outside the basis with zero votes)
        votes = solve(X, y, P, n_classes, sel.sigma, sel.ridge_c, logit_scale, seed, config)
        record.update(support_rows=int(X.shape[0]), basis="all shots" if X.shape[0] <= config.dense_max
                      else f"Nyström, {int((np.abs(votes).sum(axis=1) > 0).sum())} of the shots")
    else:
        log.info("shots: zero-shot kept (%s)", decision_record)
        votes = np.zeros((X.shape[0], n_classes))
    return ResidualFit(decision, X, y, float(sel.sigma), votes, logit_scale, sel.loo, sub, record, sel.held_rows,
                       sel.held_scores, sel.folds)
