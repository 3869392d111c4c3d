"""Shots for only some of the classes: the classes without shots keep their standing.

Labelled shots correct the zero-shot classifier near the shots. Where only some classes have shots, the correction
has no image of the others to push back with: an image of a class without shots that looks like a class with
shots is pulled to that class (the kernel head extrapolates the shot's label; the linear head's class means are
estimated for the classes with shots and only the text's prior mean stands for the others). On the dev data
(text-like prototypes, half of the classes with 4 shots) that cost 8 points of top-1 on caltech101 and 15 on sun397
against zero-shot, the classes without shots 15 and 39 (docs/fewshot.md, "Classes without shots").

The deployed default head is then the mixture (:mod:`svgen.calibration.mixture`) with the classes without shots
``U`` tilted by one log-factor δ ≥ 0:

    p'(c | x) = p(c | x) · e^{δ·[c ∈ U]} / Σ_j p(j | x) · e^{δ·[j ∈ U]}

δ is fitted on held-out evidence of both regimes, the predictor rebuilt as it is deployed (:func:`fit_offset`):

* **classes without shots**: the classes with shots are split into :data:`CLASS_FOLDS` groups; for :data:`REFITS` of
  them the whole ``adapt`` is rerun without that group's shots, and the group's shots are scored by that predictor,
  for which their classes have none — images of classes without shots, with labels;
* **classes with shots**: the same refitted predictor's own held-out shots (its balanced folds, or with one shot
  per class its exact leave-one-out: :attr:`svgen.fewshot.adapt.ShotFit.held_out`).

Each fold tilts the classes that have no shots in it, and δ minimises the mean NLL of the two kinds of evidence
weighed by the deployed share of classes without shots and with them (each kind as the balanced mixture of classes
the deployed predictor will meet). The NLL is convex in δ, so the minimiser is exact (bisection on the derivative).
With shots for every class nothing changes (there is nothing to tilt); ``add-classes`` adapts to the shots again, so
the classes it adds are classes without shots and δ is fitted for them.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from svgen.core.support import SupportSet

log = logging.getLogger(__name__)

CLASS_FOLDS = 8        # the classes with shots in this many groups: a refit without one keeps 7/8 of the shots …
REFITS = 4             # … and this many of the groups are left out, one refit each (the cost: 4 × adapt)
MAX_OFFSET = 20.0      # δ's search range [0, MAX_OFFSET] (e^20: every class without shots above every other)
BISECTIONS = 60
PROB_FLOOR = 1e-300


def class_groups(classes: np.ndarray, seed: int = 0, folds: int = CLASS_FOLDS, refits: int = REFITS) -> list:
    """``refits`` of the groups of the classes with shots split into ``folds`` of near-equal size (seeded order; at
    least one class each, so with fewer classes than ``folds`` one class per group)."""
    order = np.random.default_rng(seed).permutation(np.asarray(classes))
    return [g for g in np.array_split(order, min(folds, order.size)) if g.size][:refits]


def terms(p: np.ndarray, y: np.ndarray, shotless: np.ndarray, delta: float) -> tuple:
    """Per image, (NLL, its derivative in δ) of :func:`svgen.calibration.mixture.tilt` ``(p, δ, shotless)`` at labels
    ``y``: ``−log p_y − δ·u_y + log(1 − P_U + P_U·e^δ)``, ``P_U`` the mass on the tilted classes, derivative
    ``−u_y + P_U·e^δ / (1 − P_U + P_U·e^δ)``."""
    p = np.asarray(p, dtype=np.float64)
    u = np.asarray(shotless, dtype=bool)
    py = np.maximum(p[np.arange(y.size), y], PROB_FLOOR)
    mass = p[:, u].sum(axis=1)
    norm = (1.0 - mass) + mass * math.exp(delta)
    uy = u[y].astype(np.float64)
    return -np.log(py) - delta * uy + np.log(norm), -uy + mass * math.exp(delta) / norm


def nll_and_slope(p: np.ndarray, y: np.ndarray, shotless: np.ndarray, delta: float) -> tuple:
    """The means of :func:`terms`."""
    nll, slope = terms(p, y, shotless, delta)
    return float(nll.mean()), float(slope.mean())


def best_offset(evidence: list) -> float:
    """δ in [0, :data:`MAX_OFFSET`] minimising ``Σ weight · mean NLL`` over ``evidence`` (tuples ``(p, y, shotless,
    weight)``); convex, so 0 where the slope at 0 is ≥ 0, the upper end where it is still ≤ 0 there, else the
    root of the slope by bisection."""
    def slope(d):
        return sum(w * nll_and_slope(p, y, u, d)[1] for p, y, u, w in evidence if y.size)

    if slope(0.0) >= 0.0:
        return 0.0
    if slope(MAX_OFFSET) <= 0.0:
        return MAX_OFFSET
    lo, hi = 0.0, MAX_OFFSET
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid) < 0.0 else (lo, mid)
    return 0.5 * (lo + hi)


def losses(evidence: list, delta: float) -> float:
    """The weighted objective ``Σ weight · mean NLL`` of ``evidence`` at ``delta``."""
    return sum(w * nll_and_slope(p, y, u, delta)[0] for p, y, u, w in evidence if y.size)


def fit_offset(zero_shot, shots: SupportSet, side, refit, progress: bool = False) -> tuple:
    """(δ, record) for ``shots`` that leave some of ``side``'s classes without any, or (None, None) where every class
    has shots or fewer than two classes have them (no class can be left out and another kept). ``refit(shots)`` is
    ``adapt`` without this step (a :class:`svgen.fewshot.adapt.ShotFit`); ``zero_shot`` the heads it starts from;
    ``progress``: a progress bar over the refits."""
    from svgen.heads import predictor

    C = side.n_classes
    labels = shots.labels.numpy()
    with_shots = np.flatnonzero(np.bincount(labels, minlength=C) > 0)
    if with_shots.size == C or with_shots.size < 2:
        return None, None
    share_without = 1.0 - with_shots.size / C
    groups = class_groups(with_shots, side.config.seed)
    evidence, folds, n = [], [], len(groups)
    if progress:
        from tqdm.auto import tqdm

        groups = tqdm(groups, desc="classes without shots: refits", unit="refit")
    for group in groups:
        out = np.isin(labels, group)
        fit = refit(shots.subset(np.flatnonzero(~out)))
        shotless = np.ones(C, dtype=bool)
        shotless[np.unique(labels[~out])] = False
        head = fit.record["default_head"]
        p_out = predictor.proba(fit.heads, side.prototypes, side.config.kernel, shots.rows[out].float(), head).numpy()
        p_in, y_in = fit.held_out
        # each kind's mean NLL weighs by the deployed share of its classes; the folds are averaged
        evidence += [(p_out, labels[out], shotless, share_without / n),
                     (p_in, np.asarray(y_in), shotless, (1.0 - share_without) / n)]
        folds.append({"classes_left_without_shots": int(group.size), "their_shots": int(out.sum()),
                      "held_out_shots_of_the_others": int(len(y_in)), "default_head": head})
    delta = best_offset(evidence)

    record = {"classes_without_shots": int(C - with_shots.size), "offset": float(delta),
              "held_out_nll": {"untilted": losses(evidence, 0.0), "tilted": losses(evidence, delta)}, "folds": folds,
              "rule": "the mixture's classes without shots × e^δ, renormalised; δ ≥ 0 minimising the NLL of (a) the "
                      f"shots of each of {n} groups of 1/{CLASS_FOLDS} of the classes with shots, scored by "
                      "adapt rerun without that group's shots, and (b) that rerun's own held-out shots, weighed by the "
                      "deployed shares of classes without and with shots"}
    log.info("shots: %d of %d classes have none; their mixture probabilities × e^%.3g (held-out NLL %.4f → %.4f)",
             C - with_shots.size, C, delta, record["held_out_nll"]["untilted"], record["held_out_nll"]["tilted"])
    return delta, record
