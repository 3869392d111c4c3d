"""Kernel ridge on the zero-shot residual, ``s(x) = p₀(x) + k(x̂, X)(K + cI)⁻¹(Y − p₀(X))``: the deployed solve, its
exact leave-one-out scores and its scores on held-out folds, exact or in a Nyström basis (docs/fewshot.md)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

COINCIDENT = 1e-10   # squared distance below which two unit shots are the same image (duplicate files)


def unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def prior_probs(X: np.ndarray, P: np.ndarray, logit_scale: float = 100.0) -> np.ndarray:
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


def median_distance(X: np.ndarray, seed: int, n_max: int) -> Optional[float]:
    """The median distance between two different shots (at most ``n_max``, seeded); None when no two differ."""
    rng = np.random.default_rng(seed)
    Z = X if X.shape[0] <= n_max else X[rng.choice(X.shape[0], n_max, replace=False)]
    d2 = np.maximum(2.0 - 2.0 * Z @ Z.T, 0.0)[np.triu_indices(Z.shape[0], 1)]
    d2 = d2[d2 > COINCIDENT]
    return float(np.sqrt(np.median(d2))) if d2.size else None


def loo_at(X: np.ndarray, R: np.ndarray, p0: np.ndarray, sigma: float, c: float) -> np.ndarray:
    """Exact leave-one-out scores ``p₀ + (HR − h ⊙ R)/(1 − h)`` of the head at (σ, c) on the shots ``X``, with
    ``H = K(K + cI)⁻¹`` from the eigendecomposition ``K = U diag(e) Uᵀ``."""
    d2 = np.maximum(2.0 - 2.0 * X @ X.T, 0.0)
    e, U = np.linalg.eigh(np.exp(-d2 / (2 * sigma * sigma)))
    e = np.maximum(e, 0.0)
    g = e / (e + c)
    HR = U @ (g[:, None] * (U.T @ R))
    h = np.minimum((U * U) @ g, 1 - 1e-9)
    return p0 + (HR - h[:, None] * R) / (1 - h[:, None])


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
                        ridges, bases: list):
    """As :func:`dense_fold_scores` in a Nyström basis of shots each fold keeps (``bases``), features ``A = k(X, L)
    K_LL^{-1/2}``, one eigendecomposition per (σ, fold) for every c (docs/fewshot.md); yields ``((i, j), scores)``."""
    kept = []   # per fold: n kept, R kept (float32), d² of kept then scored shots to its basis, the basis's places
    for (removed, scored), basis in zip(folds, bases):
        keep = np.setdiff1d(np.arange(len(y)), removed)
        d2 = X[np.concatenate([keep, scored])] @ X[basis].T
        np.maximum(np.add(np.multiply(d2, -2.0, out=d2), 2.0, out=d2), 0.0, out=d2)
        kept.append((keep.size, torch.from_numpy(R[keep].astype(np.float32)), d2, np.searchsorted(keep, basis)))
    for i, sigma in enumerate(sigmas):
        parts, start = [[] for _ in ridges], 0
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


def solve(X: np.ndarray, R: np.ndarray, y: np.ndarray, sigma: float, c: float, seed: int, dense_max: int,
          basis_size: int) -> np.ndarray:
    """The votes ``(K + cI)⁻¹ R`` (N×C), above ``dense_max`` shots in a Nyström basis of ``basis_size`` holding the
    same fraction of each class (seeded; the others' votes 0)."""
    if X.shape[0] <= dense_max:
        K = rbf(X, X, sigma)
        K[np.diag_indices_from(K)] += c
        return np.linalg.solve(K, R)
    rng = np.random.default_rng(seed)
    frac = min(basis_size / X.shape[0], 1.0)
    basis = np.sort(np.concatenate([rng.choice(idx, size=max(1, int(frac * len(idx))), replace=False)
                                    for idx in (np.flatnonzero(y == k) for k in np.unique(y))]))
    L = X[basis]
    K_LX = rbf(L, X, sigma)
    A = K_LX @ K_LX.T + c * rbf(L, L, sigma)
    A[np.diag_indices_from(A)] += 1e-8 * float(np.trace(A)) / A.shape[0]
    V = np.zeros_like(R)
    V[basis] = np.linalg.solve(A, K_LX @ R)
    return V
