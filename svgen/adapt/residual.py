"""The kernel head with shots (:mod:`svgen.adapt.solvers.ridge`): zero-shot or σ × c by ``CHOICES["kernel"]``."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from svgen import records
from svgen.adapt.config import AdaptConfig
from svgen.adapt.heldout import HeldOut, shot_sample
from svgen.adapt.select import Choice, choose
from svgen.adapt.solvers import ridge
from svgen.adapt.solvers.ridge import prior_probs, rbf, unit  # noqa: F401  (the kernel head's formulas)
from svgen.heads.scoring import CLIP_LOGIT_SCALE

log = logging.getLogger(__name__)

ZERO_SHOT = "zero-shot"


@dataclass
class ResidualFit:
    """The kernel head ``p₀(x) + k(x̂, rows) @ votes``, its choice and record, its scores and p₀ at ``ev.rows``."""

    choice: Choice
    adopted: bool
    rows: np.ndarray
    labels: np.ndarray
    sigma: float
    ridge_c: float
    votes: np.ndarray
    record: dict
    held_scores: Optional[np.ndarray] = None   # None where zero-shot was kept
    held_prior: Optional[np.ndarray] = None


def settings(X: np.ndarray, ev: HeldOut, config: AdaptConfig) -> tuple:
    """(the (σ, c) candidates, larger c then larger σ first; the median shot distance). One shot per class, or every
    shot the same image: Tip-Adapter's σ = 1/√β and c alone, and None."""
    med = None if ev.one_shot else ridge.median_distance(X, ev.seed, config.select_max)
    if med is None:
        return [(1.0 / math.sqrt(config.one_shot_beta), config.one_shot_ridge)], None
    cells = [(f * med, c) for f in config.sigma_factors for c in config.ridges]
    return sorted(cells, key=lambda sc: (-sc[1], -sc[0])), med


def held_scores(X, y, R, p0_held, ev: HeldOut, cells: list, config: AdaptConfig):
    """Yields ``((σ, c), scores at ev.rows)``: leave-one-out with one shot per class, else the folds' refits (exact up
    to ``select_max`` shots, else in a Nyström basis of ``select_basis`` shots each fold keeps)."""
    if ev.one_shot:
        for sigma, c in cells:
            yield (sigma, c), ridge.loo_at(X[ev.rows], R[ev.rows], p0_held, sigma, c)
        return
    sigmas, ridges = sorted({s for s, _ in cells}), sorted({c for _, c in cells})
    if X.shape[0] <= config.select_max:
        p0 = np.zeros((len(y), R.shape[1]))
        p0[ev.rows] = p0_held   # only the scored rows are read
        parts = ridge.dense_fold_scores(np.maximum(2.0 - 2.0 * X @ X.T, 0.0), y, R, p0, list(ev.folds), sigmas,
                                        ridges).items()
    else:
        keeps = [np.setdiff1d(np.arange(len(y)), removed) for removed, _ in ev.folds]
        bases = [k if (pick := shot_sample(y[k], config.select_basis, ev.seed)) is None else k[pick] for k in keeps]
        parts = ridge.nystrom_fold_scores(X, y, R, p0_held, list(ev.folds), sigmas, ridges, bases)
    for (i, j), sc in parts:
        yield (sigmas[i], ridges[j]), sc


def fit_residual_head(X, y, P, n_classes: int, ev: HeldOut, config: AdaptConfig) -> ResidualFit:
    """Zero-shot and every (σ, c) scored on ``ev``, :func:`choose`, then the deployed solve (p₀ at CLIP's scale)."""
    X, P, y = unit(X), unit(P), np.asarray(y, dtype=np.int64)
    R = ridge.residuals(X, y, P, n_classes, CLIP_LOGIT_SCALE)
    p0_held = (prior_probs(X, P, CLIP_LOGIT_SCALE)[ev.rows] if X.shape[0] <= config.select_max
               else np.eye(n_classes)[y[ev.rows]] - R[ev.rows])
    cells, med = settings(X, ev, config)
    hits = {cell: sc.argmax(axis=1) == ev.labels for cell, sc in held_scores(X, y, R, p0_held, ev, cells, config)}
    zero = {ZERO_SHOT: p0_held.argmax(axis=1) == ev.labels} if ev.judges_zero_shot else {}
    choice = choose({**zero, **{c: hits[c] for c in cells}}, ev, "kernel", config.level)
    (sigma, c), kept = choice.best, choice.chosen != ZERO_SHOT
    scores = next(held_scores(X, y, R, p0_held, ev, [(sigma, c)], config))[1] if kept else None
    record = records.kernel(choice, kept, med, ev, config, CLIP_LOGIT_SCALE, X.shape[0])
    if kept:   # every shot a row (above dense_max those outside the basis with zero votes)
        votes = ridge.solve(X, R, y, sigma, c, ev.seed, config.dense_max, config.nystrom_basis)
        record.update(records.kernel_basis(X.shape[0], config.dense_max, int((np.abs(votes).sum(axis=1) > 0).sum())))
    else:
        log.info("shots: zero-shot kept (%s)", choice.why)
        votes = np.zeros((X.shape[0], n_classes))
    return ResidualFit(choice, kept, X, y, float(sigma), float(c), votes, record, scores, p0_held)
