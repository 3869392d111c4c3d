"""The kernel head with shots, ``s(x) = p₀(x) + k(x̂, X)(K + cI)⁻¹(Y − p₀(X))`` (:mod:`svgen.adapt.solvers.ridge`):
zero-shot or σ × c, chosen on the held-out evidence by :func:`svgen.adapt.select.choose` (``CHOICES["kernel"]``;
docs/fewshot.md, "The kernel head")."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from svgen.adapt.config import AdaptConfig
from svgen.adapt.heldout import Evidence, shot_sample
from svgen.adapt.select import Choice, Decision, ShotReason, choose, paired
from svgen.adapt.solvers import ridge
from svgen.adapt.solvers.ridge import rbf, unit  # noqa: F401  (the kernel head's names, for callers)
from svgen.heads.scoring import CLIP_LOGIT_SCALE

log = logging.getLogger(__name__)

ZERO_SHOT = "zero-shot"
ONE_SHOT_RULE = "one shot per class: leave-one-out would leave the image's class without any shot, so it cannot " \
                "judge the correction"


def prior_probs(X: np.ndarray, P: np.ndarray, logit_scale: float = CLIP_LOGIT_SCALE) -> np.ndarray:
    """``p₀ = softmax(τ · x̂ P̂ᵀ)`` at CLIP's logit scale unless told (:func:`svgen.adapt.solvers.ridge.prior_probs`)."""
    return ridge.prior_probs(X, P, logit_scale)


@dataclass
class ResidualFit:
    """The kernel head ``s(x) = p₀(x) + k(x̂, rows) @ votes``, its choice and decision, and its scores at the
    evidence's scored shots (``held_scores``, in ``evidence.rows`` order; None where zero-shot was kept)."""

    choice: Choice
    decision: Decision
    rows: np.ndarray
    labels: np.ndarray
    sigma: float
    ridge_c: float
    votes: np.ndarray
    logit_scale: float
    record: dict
    held_scores: Optional[np.ndarray] = None
    held_prior: Optional[np.ndarray] = None

    @property
    def adopted(self) -> bool:
        return self.decision.kept


def settings(X: np.ndarray, ev: Evidence, config: AdaptConfig) -> tuple:
    """(the (σ, c) candidates, nearest zero-shot first: larger c, then larger σ; the median shot distance or None).
    One shot per class, or every shot the same image: Tip-Adapter's σ = 1/√β and c, the only candidate."""
    med = None if ev.one_shot else ridge.median_distance(X, ev.seed, config.select_max)
    if med is None:
        return [(1.0 / math.sqrt(config.one_shot_beta), config.one_shot_ridge)], None
    cells = [(f * med, c) for f in config.sigma_factors for c in config.ridges]
    return sorted(cells, key=lambda sc: (-sc[1], -sc[0])), med


def held_scores(X, y, R, p0_held, ev: Evidence, cells: list, config: AdaptConfig):
    """Yields ``((σ, c), H×C scores at ev.rows)``: leave-one-out with one shot per class, else the folds' refits
    (exact below ``select_max`` shots, else in a Nyström basis of ``select_basis`` shots each fold keeps)."""
    if ev.one_shot:
        Xs = X[ev.rows]
        for sigma, c in cells:
            yield (sigma, c), ridge.loo_at(Xs, R[ev.rows], p0_held, sigma, c)
        return
    sigmas, ridges = sorted({s for s, _ in cells}), sorted({c for _, c in cells})
    if X.shape[0] <= config.select_max:
        d2 = np.maximum(2.0 - 2.0 * X @ X.T, 0.0)
        p0 = np.zeros((len(y), R.shape[1]))
        p0[ev.rows] = p0_held   # only the scored rows are read
        parts = ridge.dense_fold_scores(d2, y, R, p0, list(ev.folds), sigmas, ridges).items()
    else:
        bases = []
        for removed, _ in ev.folds:
            keep = np.setdiff1d(np.arange(len(y)), removed)
            pick = shot_sample(y[keep], config.select_basis, ev.seed)
            bases.append(keep if pick is None else keep[pick])
        parts = ridge.nystrom_fold_scores(X, y, R, p0_held, list(ev.folds), sigmas, ridges, bases)
    for (i, j), sc in parts:
        yield (sigmas[i], ridges[j]), sc


def fit_residual_head(X, y, P, n_classes: int, ev: Evidence, logit_scale: float,
                      config: AdaptConfig) -> ResidualFit:
    """The kernel head: every (σ, c) and zero-shot scored on ``ev``, :func:`choose`, then the deployed solve."""
    X, P, y = unit(X), unit(P), np.asarray(y, dtype=np.int64)
    R = ridge.residuals(X, y, P, n_classes, logit_scale)
    p0_held = (prior_probs(X, P, logit_scale)[ev.rows] if X.shape[0] <= config.select_max
               else np.eye(n_classes)[y[ev.rows]] - R[ev.rows])
    cells, med = settings(X, ev, config)
    hits = {ZERO_SHOT: (p0_held.argmax(axis=1) == ev.labels).astype(float)}
    for cell, sc in held_scores(X, y, R, p0_held, ev, cells, config):
        hits[cell] = (sc.argmax(axis=1) == ev.labels).astype(float)
    offered = {ZERO_SHOT: hits[ZERO_SHOT]} if ev.judges_zero_shot else {}
    choice = choose({**offered, **{c: hits[c] for c in cells}}, ev, "kernel", config.level)
    sigma, c = choice.best
    kept = choice.chosen != ZERO_SHOT
    reason = (ShotReason.NOT_BEHIND if kept else ShotReason.BEHIND) if offered else ShotReason.NO_EVIDENCE
    decision = Decision(kept, reason, paired(hits[choice.best], hits[ZERO_SHOT]) if offered else None,
                        level=config.level)
    scores = next(held_scores(X, y, R, p0_held, ev, [(sigma, c)], config))[1] if kept else None
    record = residual_record(choice, decision, sigma, c, med, ev, config, logit_scale, X.shape[0])
    if decision.kept:   # every shot a row (above dense_max those outside the basis with zero votes)
        votes = ridge.solve(X, R, y, sigma, c, ev.seed, config.dense_max, config.nystrom_basis)
        record.update(support_rows=int(X.shape[0]), basis="all shots" if X.shape[0] <= config.dense_max
                      else f"Nyström, {int((np.abs(votes).sum(axis=1) > 0).sum())} of the shots")
    else:
        log.info("shots: zero-shot kept (%s)", choice.why)
        votes = np.zeros((X.shape[0], n_classes))
    return ResidualFit(choice, decision, X, y, float(sigma), float(c), votes, logit_scale, record, scores, p0_held)


def residual_record(choice: Choice, decision: Decision, sigma: float, c: float, med, ev: Evidence,
                    config: AdaptConfig, logit_scale: float, n_shots: int) -> dict:
    """The kernel head's ``svgen.json`` record (output only)."""
    if med is None:
        selection = {"one_shot": True, "rule": f"{'one shot per class' if ev.one_shot else 'every shot is the same image'}"
                     f": σ = 1/√β (Tip-Adapter's β = {config.one_shot_beta:g}), c = {config.one_shot_ridge:g}"
                     f"{' (the shot and the text weigh the same)' if config.one_shot_ridge == 1 else ''}; "
                     "the labels cannot identify either"}
    else:
        factor = next(f for f in config.sigma_factors if f * med == sigma)
        selection = {"one_shot": False, "sigma_factor": factor, "median_distance": med,
                     "held_out_accuracy": choice.means[choice.best], "folds": len(ev.folds),
                     **({"refits": f"Nyström basis of {config.select_basis} shots, every class"}
                        if n_shots > config.select_max else {}),
                     "rule": "σ (× the median shot distance) and c with the best accuracy on held-out shots (balanced "
                             "folds, the deployed predictor); ties to the larger c, then σ"}
    return {"sigma": float(sigma), "ridge_c": float(c), "logit_scale": float(logit_scale), "selection": selection,
            "decision": ({"adopted": True, "rule": ONE_SHOT_RULE} if decision.reason is ShotReason.NO_EVIDENCE
                         else decision.to_json()), "shots": int(n_shots),
            "scored_shots": int(ev.rows.size)}
