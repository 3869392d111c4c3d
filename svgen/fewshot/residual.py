"""Labelled shots as a correction to the zero-shot probabilities: kernel ridge on their residual.

The adapted kernel head scores an image ``x`` (unit ``x̂``) by

    s(x) = p₀(x) + k(x̂, X) V,       p₀(x) = softmax(τ · x̂ P̂ᵀ),      V = (K_XX + c·I)⁻¹ (Y − p₀(X))

with ``P̂`` the unit text prototypes, ``τ`` CLIP's logit scale (100), ``X`` the N unit shots, ``Y``
their one-hot labels and ``k`` the RBF kernel of bandwidth σ. It is the posterior mean of a Gaussian
process whose prior mean is the zero-shot classifier's probabilities: the shots correct p₀ where it
is wrong, and where the text is confident and right their residual ``Y − p₀`` is small, so a strong
prior (ImageNet's text, 1,000 classes) is changed little and a weak one (fine-grained sets) a lot.
Both the prior and the correction are in probability units, so there is no free scale between them.

Settings, from the shots alone, on the predictor as it is deployed (prior on):

* **σ and c by cross-validation on balanced folds** (:func:`balanced_folds`): each fold holds out one
  shot of every class, the head is refitted on the rest and scored on the fold; the setting with the
  best held-out accuracy wins (ties to the larger c, then σ). One eigendecomposition per (σ, fold)
  scores every c. Plain leave-one-out would leave the held-out image's class one shot short of all
  the others, which at two shots per class refused corrections worth +6 on the queries (fgvc); the
  GP marginal likelihood, tried first, chose c 10–100× too large at two shots (stanford_cars −9 points
  against the cross-validated c: docs/fewshot.md).
* **Zero-shot is always a candidate.** The adapted head is kept only if its held-out accuracy at the
  chosen setting is not below zero-shot's on the same shots by more than one standard error of the
  paired difference (:func:`paired_decision`); otherwise the artifact's zero-shot kernel head stays,
  exactly.
* **With one shot per class** nothing in the labels can say how alike two images of one class are
  (the only pairs of shots are of different classes, and a held-out shot would leave its class with
  none), so σ is Tip-Adapter's published bandwidth (``exp(−β(1 − x̂·x̂'))`` with β = 5.5, i.e.
  σ = 1/√β) and c = 1: one shot and the text prior weigh the same (an isolated shot's residual is
  halved). This is a stated default, not a fitted value; ``docs/fewshot.md`` reports what it gives.
* The temperature (``svgen.fewshot.adapt.temperatures``) comes from the balanced folds' held-out scores
  at the chosen setting (:attr:`ResidualFit.held_scores`); with one shot per class, which has no folds,
  from the exact leave-one-out scores ``s_loo = p₀ + (HR − h ⊙ R)/(1 − h)``, ``H = K(K + cI)⁻¹``,
  ``h = diag H`` (they describe images of a class with no shot: pessimistic, so a softer T).

Above :data:`~svgen.fewshot.select.SELECT_MAX` shots the folds' held-out shots are subsampled (never the classes:
:func:`svgen.fewshot.select.balanced_folds`), and each fold's head is refitted on every other shot of every class in
a Nyström basis of :data:`SELECT_BASIS` shots, computed exactly for all folds and ridges at once from one fit per σ
(:func:`nystrom_fold_scores`); each held-out shot is scored against all C classes with the prior on. The head is
solved on all shots, exactly up to :data:`DENSE_MAX` and above through a Nyström basis of :data:`NYSTROM_BASIS` shots.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from svgen.selection import DEFAULT, balanced_folds, shot_sample, shot_test

SELECT_MAX = DEFAULT.select_max
MAX_FOLDS = DEFAULT.max_folds
from svgen.heads.scoring import CLIP_LOGIT_SCALE

log = logging.getLogger(__name__)

SIGMA_FACTORS = (0.35, 0.5, 0.7, 1.0)        # × the median distance between shots
RIDGES = tuple(10.0 ** p for p in np.arange(-3.0, 1.51, 0.5))   # c
TIP_ADAPTER_BETA = 5.5                        # Zhang et al. 2022, the cache's sharpness at its default
ONE_SHOT_RIDGE = 1.0
SELECT_BASIS = 1024     # Nyström basis of the folds' refits above SELECT_MAX shots
DENSE_MAX = 4096        # shots solved exactly (4,096: ~2.4 s CPU, 1,000 classes); above, in a Nyström basis
NYSTROM_BASIS = 1536


@dataclass
class ResidualFit:
    """What :func:`fit_residual_head` decided: the head (rows, σ, vote weights) and why."""

    adopted: bool
    rows: np.ndarray                    # N×D unit shots (refused or Nyström: some or all with zero votes)
    labels: np.ndarray                  # M class indices of those rows
    sigma: float
    votes: np.ndarray                   # M×C: s(x) = p₀(x) + k(x̂, rows) @ votes
    logit_scale: float
    loo_scores: Optional[np.ndarray]    # N×C leave-one-out scores of the (scored) shots
    loo_rows: Optional[np.ndarray]      # which shots those are (None: all)
    record: dict = field(default_factory=dict)
    held_rows: Optional[np.ndarray] = None     # the balanced folds' held-out shots (indices into all shots)
    held_scores: Optional[np.ndarray] = None   # the adapted head's scores on them, refitted without each fold
    folds: Optional[list] = None               # the folds themselves (indices into all shots)


def unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def prior_probs(X: np.ndarray, P: np.ndarray, logit_scale: float = CLIP_LOGIT_SCALE) -> np.ndarray:
    """``p₀ = softmax(τ · x̂ P̂ᵀ)``: CLIP's zero-shot probabilities (unit rows in, N×C out; computed in place,
    as :func:`softmax`, so 16,000 shots × 1,000 classes hold one such array)."""
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
    """``exp(−||a − b||²/(2σ²))`` for unit rows (``||a − b||² = 2 − 2 a·b``)."""
    return np.exp(-np.maximum(2.0 - 2.0 * (A @ B.T), 0.0) / (2.0 * sigma * sigma))


COINCIDENT = 1e-10   # squared distance below which two unit shots are the same image (duplicate files)


def median_distance(X: np.ndarray, seed: int = 0, n_max: int = 1024) -> Optional[float]:
    """The median distance between two *different* shots (at most ``n_max`` of them, seeded); None when no two
    differ. Copies of one image say nothing about how far apart images are: with them counted, a set of mostly
    duplicate shots gave a median of 0, hence σ = 0."""
    rng = np.random.default_rng(seed)
    Z = X if X.shape[0] <= n_max else X[rng.choice(X.shape[0], n_max, replace=False)]
    d2 = np.maximum(2.0 - 2.0 * Z @ Z.T, 0.0)[np.triu_indices(Z.shape[0], 1)]
    d2 = d2[d2 > COINCIDENT]
    return float(np.sqrt(np.median(d2))) if d2.size else None


def loo_scores(U: np.ndarray, e: np.ndarray, c: float, R: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """Exact leave-one-out scores ``p₀ + (HR − h ⊙ R)/(1 − h)`` of the smoother ``H = K(K + cI)⁻¹``."""
    g = e / (e + c)
    HR = U @ (g[:, None] * (U.T @ R))
    h = np.minimum((U * U) @ g, 1 - 1e-9)
    return p0 + (HR - h[:, None] * R) / (1 - h[:, None])


def stratified(labels: np.ndarray, n_max: int, seed: int) -> Optional[np.ndarray]:
    """At most ``n_max`` indices, the same fraction of each class (None: all of them)."""
    if labels.shape[0] <= n_max:
        return None
    rng = np.random.default_rng(seed)
    frac = n_max / labels.shape[0]
    keep = [rng.choice(idx, size=max(1, int(frac * len(idx))), replace=False)
            for idx in (np.flatnonzero(labels == c) for c in np.unique(labels))]
    return np.sort(np.concatenate(keep))


def class_subset(labels: np.ndarray, n_max: int, seed: int) -> Optional[np.ndarray]:
    """Indices of every shot of a random set of classes, at most ``n_max`` in all (None: all of them)."""
    if labels.shape[0] <= n_max:
        return None
    rng = np.random.default_rng(seed)
    counts = np.bincount(labels)
    chosen, total = [], 0
    for c in rng.permutation(np.flatnonzero(counts)):
        if total + counts[c] > n_max and chosen:
            continue
        chosen.append(c)
        total += counts[c]
    return np.flatnonzero(np.isin(labels, chosen))


def select(X: np.ndarray, y: np.ndarray, P: np.ndarray, C: int, logit_scale: float, seed: int = 0) -> dict:
    """σ and c by cross-validation of the deployed predictor on balanced folds (two or more shots in some
    class), or the one-shot default; with the chosen setting's held-out scores (the decision's evidence)
    and, up to :data:`SELECT_MAX` shots, exact leave-one-out scores (the temperature's with one shot per class)."""
    R = residuals(X, y, P, C, logit_scale)
    big = X.shape[0] > SELECT_MAX
    p0 = None if big else prior_probs(X, P, logit_scale)
    d2 = None if big else np.maximum(2.0 - 2.0 * X @ X.T, 0.0)

    def loo(sigma, c):
        if d2 is None:
            return None
        e, U = np.linalg.eigh(np.exp(-d2 / (2 * sigma * sigma)))
        return loo_scores(U, np.maximum(e, 0.0), c, R, p0)

    one_shot = np.bincount(y, minlength=C).max() <= 1
    med = None if one_shot else median_distance(X, seed)
    if med is None:   # LOO still gives the temperature (pessimistic: a softer T)
        sigma, c = 1.0 / math.sqrt(TIP_ADAPTER_BETA), ONE_SHOT_RIDGE
        what = "one shot per class" if one_shot else "every shot is the same image"
        return {"sigma": sigma, "ridge_c": c, "loo": loo(sigma, c), "one_shot": True,
                "rule": f"{what}: σ = 1/√β (Tip-Adapter's β = 5.5), c = 1 (the shot and the text weigh "
                        "the same); the labels cannot identify either"}
    folds = balanced_folds(y, seed, n_max=SELECT_MAX)
    held = np.concatenate(folds)
    if p0 is None:
        p0_held = -R[held]
        p0_held[np.arange(held.size), y[held]] += 1.0
    else:
        p0_held = p0[held]
    sigmas = [f * med for f in SIGMA_FACTORS]
    if big:
        correct, scores = nystrom_fold_scores(X, y, R, p0_held, folds, sigmas, RIDGES, seed)
    else:
        correct, scores = dense_fold_scores(d2, y, R, p0, folds, sigmas, RIDGES)
    acc = correct.mean(axis=2)
    extra = {"refits": f"Nyström basis of {SELECT_BASIS} shots, every class"} if big else {}
    # the best held-out accuracy; ties to the smoother setting (larger c, then larger σ)
    i, j = max(((i, j) for i in range(acc.shape[0]) for j in range(acc.shape[1])),
               key=lambda ij: (acc[ij], RIDGES[ij[1]], ij[0]))
    sigma, c = sigmas[i], RIDGES[j]
    return {"sigma": sigma, "ridge_c": c, "one_shot": False, "sigma_factor": SIGMA_FACTORS[i], "median_distance": med,
            "held_out_rows": held, "held_out_scores": scores[i, j], "held_out_accuracy": float(acc[i, j]),
            "folds": len(folds), "fold_rows": folds, "loo": loo(sigma, c), "p0_held": p0_held, **extra,
            "rule": "σ (× the median shot distance) and c with the best accuracy on held-out shots (balanced folds, "
                    "the deployed predictor); ties to the larger c, then σ"}


def dense_fold_scores(d2: np.ndarray, y: np.ndarray, R: np.ndarray, p0: np.ndarray, folds: list, sigmas, ridges):
    """(correct S×R×H, {(i, j): H×C scores}): the head refitted exactly without each fold at every (σ, c), scored on
    the fold; one eigendecomposition per (σ, fold) scores every c."""
    held = np.concatenate(folds)
    correct = np.zeros((len(sigmas), len(ridges), held.size), dtype=bool)
    parts = {}
    start = 0
    for held_f in folds:
        keep = np.setdiff1d(np.arange(len(y)), held_f)
        for i, sigma in enumerate(sigmas):
            e, U = np.linalg.eigh(np.exp(-d2[np.ix_(keep, keep)] / (2 * sigma * sigma)))
            e, UR, Kh = np.maximum(e, 0.0), U.T @ R[keep], np.exp(-d2[np.ix_(held_f, keep)] / (2 * sigma * sigma))
            KU = Kh @ U
            for j, c in enumerate(ridges):
                sc = p0[held_f] + KU @ (UR / (e + c)[:, None])
                correct[i, j, start:start + held_f.size] = sc.argmax(axis=1) == y[held_f]
                parts.setdefault((i, j), []).append(sc)
        start += held_f.size
    return correct, {k: np.concatenate(v) for k, v in parts.items()}


def nystrom_fold_scores(X: np.ndarray, y: np.ndarray, R: np.ndarray, p0_held: np.ndarray, folds: list, sigmas,
                        ridges, seed: int = 0):
    """As :func:`dense_fold_scores`, for many shots: the head in a Nyström basis ``L`` of :data:`SELECT_BASIS` shots
    outside the folds, spread over the classes (the form :func:`solve` deploys above :data:`DENSE_MAX`: ridge on the
    features ``ψ(x) = k(x, L) K_LL^{-1/2}``), refitted without each fold by the exact block formula
    ``R_H − f₋H(X_H) = (I − H_HH)⁻¹ (R_H − F_H)`` (``F`` the fit on every shot, ``H`` its hat matrix), so every
    fold and ridge costs one eigendecomposition per σ. Each fold's head is fitted on every other shot of every class;
    its held-out shots are scored against all C classes. (A held-out shot as a basis centre leaves its direction
    without data once the shot is out: at small c its weight is unconstrained, measured 13 points low on sun397.)"""
    held = np.concatenate(folds)
    rest = np.setdiff1d(np.arange(len(y)), held)
    pick = shot_sample(y[rest], SELECT_BASIS, seed)
    basis = rest if pick is None else rest[pick]
    d2_XL = X @ X[basis].T                               # squared distances to the basis, in place
    d2_XL *= -2.0
    d2_XL += 2.0
    np.maximum(d2_XL, 0.0, out=d2_XL)
    d2_LL = d2_XL[basis]
    R_H, p0_H = R[held], p0_held
    bounds = np.cumsum([0] + [f.size for f in folds])
    correct = np.zeros((len(sigmas), len(ridges), held.size), dtype=bool)
    scores = {}
    for i, sigma in enumerate(sigmas):
        K_XL = np.exp(d2_XL * (-0.5 / (sigma * sigma)))
        lam, Q = np.linalg.eigh(np.exp(d2_LL * (-0.5 / (sigma * sigma))))
        ok = lam > 1e-10 * lam.max()
        T = Q[:, ok] / np.sqrt(lam[ok])                  # K_LL^{-1/2} on its range
        s, V = np.linalg.eigh(T.T @ (K_XL.T @ K_XL) @ T)
        s, W = np.maximum(s, 0.0), T @ V
        # the per-ridge products in single precision (the held-out scores' argmax is what they decide)
        AR = (W.T @ (K_XL.T @ R)).astype(np.float32)     # features' eigenbasis × residuals
        A_H = K_XL[held] @ W
        for j, c in enumerate(ridges):
            g = 1.0 / (s + c)
            F = (A_H * g).astype(np.float32) @ AR        # the fit on every shot, at the held-out shots
            sc = np.empty(F.shape)
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                A_f = A_H[lo:hi]
                I_H = np.eye(hi - lo) - (A_f * g) @ A_f.T
                sc[lo:hi] = p0_H[lo:hi] + R_H[lo:hi] - np.linalg.solve(
                    I_H.astype(np.float32), (R_H[lo:hi] - F[lo:hi]).astype(np.float32))
            correct[i, j] = sc.argmax(axis=1) == y[held]
            scores[i, j] = sc
    return correct, scores


def paired_decision(held: np.ndarray, p0: np.ndarray, y: np.ndarray) -> dict:
    """Zero-shot against the adapted head on held-out shots (:func:`select`'s fold scores), paired shot by
    shot (:func:`svgen.selection.shot_test`); the decision's record."""
    return shot_test(held.argmax(axis=1) == y, p0.argmax(axis=1) == y).to_json()


def solve(X: np.ndarray, y: np.ndarray, P: np.ndarray, C: int, sigma: float, c: float, logit_scale: float,
          seed: int = 0):
    """(rows, labels, votes): ``V = (K + cI)⁻¹ (Y − p₀)`` on all shots; above :data:`DENSE_MAX` shots in a
    Nyström basis ``L`` of :data:`NYSTROM_BASIS` shots, ``k(x, X) ≈ k(x, L) K_LL⁻¹ k(L, X)``, which gives
    ``V_L = (K_LX K_XL + c K_LL)⁻¹ K_LX (Y − p₀)`` over the basis rows (the other shots are rows with zero votes)."""
    R = residuals(X, y, P, C, logit_scale)
    if X.shape[0] <= DENSE_MAX:
        K = rbf(X, X, sigma)
        K[np.diag_indices_from(K)] += c
        return X, y, np.linalg.solve(K, R)
    basis = stratified(y, NYSTROM_BASIS, seed)
    L = X[basis]
    K_LX = rbf(L, X, sigma)
    A = K_LX @ K_LX.T + c * rbf(L, L, sigma)
    A[np.diag_indices_from(A)] += 1e-8 * float(np.trace(A)) / A.shape[0]
    V = np.zeros_like(R)          # every shot stays a row (adapting again needs them); the basis rows vote
    V[basis] = np.linalg.solve(A, K_LX @ R)
    return X, y, V


def fit_residual_head(X, y, P, n_classes: int, logit_scale: float = CLIP_LOGIT_SCALE, seed: int = 0) -> ResidualFit:
    """The adapted kernel head for shots ``X`` (N×D), labels ``y`` and text prototypes ``P`` (C×D):
    settings by :func:`select`, kept or refused by :func:`paired_decision`, solved by :func:`solve`.
    Every choice is made on all shots of all classes; with one shot per class and more than
    :data:`SELECT_MAX` shots, the leave-one-out scores (the temperature's) are those of a sample of shots."""
    X, P = unit(X), unit(P)
    y = np.asarray(y, dtype=np.int64)
    one_shot = np.bincount(y, minlength=n_classes).max() <= 1
    sub = shot_sample(y, SELECT_MAX, seed) if one_shot else None
    Xs, ys = (X, y) if sub is None else (X[sub], y[sub])
    sel = select(Xs, ys, P, n_classes, logit_scale, seed)
    if sel.get("one_shot"):
        decision = {"adopted": True,
                    "rule": "one shot per class: leave-one-out would leave the image's class "
                            "without any shot, so it cannot judge the correction"}
    else:
        rows = sel["held_out_rows"]
        decision = paired_decision(sel["held_out_scores"], sel["p0_held"], ys[rows])
    record = {"sigma": float(sel["sigma"]), "ridge_c": float(sel["ridge_c"]), "logit_scale": float(logit_scale),
              "selection": {k: v for k, v in sel.items()
                            if k not in ("loo", "p0_held", "sigma", "ridge_c", "held_out_rows", "held_out_scores",
                                         "fold_rows")},
              "decision": decision, "shots": int(X.shape[0]), "scored_shots": int(Xs.shape[0])}
    held = {}
    if not sel.get("one_shot"):
        held = {"held_rows": sel["held_out_rows"], "held_scores": sel["held_out_scores"], "folds": sel["fold_rows"]}
    if not decision["adopted"]:
        log.info("shots: zero-shot kept (%s)", decision)
        return ResidualFit(False, X, y, float(sel["sigma"]), np.zeros((X.shape[0], n_classes)), logit_scale,
                           sel["loo"], sub, record, **held)
    rows, labels, votes = solve(X, y, P, n_classes, sel["sigma"], sel["ridge_c"], logit_scale, seed)
    record["support_rows"] = int(rows.shape[0])
    voting = int((np.abs(votes).sum(axis=1) > 0).sum())
    record["basis"] = "all shots" if X.shape[0] <= DENSE_MAX else f"Nyström, {voting} of the shots"
    return ResidualFit(True, rows, labels, float(sel["sigma"]), votes, logit_scale, sel["loo"], sub, record, **held)
