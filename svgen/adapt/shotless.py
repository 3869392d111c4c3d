"""Shots for only some classes: the mixture with the classes without shots ``U`` tilted, ``p'(c | x) ∝
p(c | x)·e^{δ·[c ∈ U]}``, (w, δ) by ``CHOICES["shotless_tilt"]`` (docs/fewshot.md, "Classes without shots")."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from svgen.heads.calibration import PROB_FLOOR, mix, tilt
from svgen.core.roots import convex_minimum, golden_minimum
from svgen.core.support import SupportSet
from svgen import records
from svgen.adapt import heldout
from svgen.heads import predictor
from svgen.adapt.config import AdaptConfig
from svgen.adapt.select import choose
from svgen.steps import bar

log = logging.getLogger(__name__)

MAX_OFFSET = 20.0      # δ's search range [0, MAX_OFFSET] (e^20: every class without shots above every other)
BISECTIONS = 60
WEIGHT_STEPS = 100     # the mixture weight's first search: w = 0, 0.01, …, 1 (then golden section)
GOLDEN_STEPS = 30


class Tilt(NamedTuple):
    """The mixture's weight w and tilt δ, its record, and each head against zero-shot."""

    weight: float
    offset: float
    record: dict
    versus: dict


def evidence(p_kernel: np.ndarray, p_linear: np.ndarray, y: np.ndarray, shotless: np.ndarray, weight: float) -> tuple:
    """Per image of classes ``y``: each head's p_y and mass on the tilted classes, [y ∈ U], its share of ``weight``."""
    y, u, rows = np.asarray(y, dtype=np.int64), np.asarray(shotless, dtype=bool), np.arange(len(y))
    pk, pl = np.asarray(p_kernel, dtype=np.float64), np.asarray(p_linear, dtype=np.float64)
    return (pk[rows, y], pl[rows, y], pk[:, u].sum(axis=1), pl[:, u].sum(axis=1), u[y].astype(np.float64),
            np.full(y.size, float(weight) / max(y.size, 1)))


def _stacked(evidence, w: float) -> tuple:
    """At weight ``w``, every image: the mixture's ``−log p_y``, its mass ``P_U`` on U, ``[y ∈ U]``, its share."""
    if isinstance(evidence, tuple):   # already stacked
        return evidence
    k, li, mass_k, mass_l, tilted, share = (np.concatenate(a) for a in zip(*evidence))
    return -np.log(np.maximum(mix(w, k, li), PROB_FLOOR)), mix(w, mass_k, mass_l), tilted, share


def per_image(evidence, w: float, delta: float) -> np.ndarray:
    """Per image, the tilted mixture's NLL ``−log p_y − δ·u_y + log(1 − P_U + P_U·e^δ)`` (a list of :func:`evidence`)."""
    nll, mass, tilted, _ = _stacked(evidence, w)
    return nll - delta * tilted + np.log((1.0 - mass) + mass * math.exp(delta))


def objective(evidence, w: float, delta: float) -> float:
    """The tilted mixture's NLL, each image at its share: ``Σ share·`` :func:`per_image`."""
    return float(_stacked(evidence, w)[3] @ per_image(evidence, w, delta))


def slope(evidence, w: float, delta: float) -> float:
    """The derivative of :func:`objective` in δ."""
    _, mass, tilted, share = _stacked(evidence, w)
    g = math.exp(delta)
    return float(share @ (mass * g / ((1.0 - mass) + mass * g) - tilted))


def best_offset(evidence, w: float) -> float:
    """δ in [0, MAX_OFFSET] minimising :func:`objective` at ``w`` (convex in δ: the root of :func:`slope`)."""
    st = _stacked(evidence, w)
    return convex_minimum(lambda delta: slope(st, w, delta), 0.0, MAX_OFFSET, BISECTIONS)


def best_weight_and_offset(evidence: list, level: float) -> tuple:
    """(w, δ) minimising :func:`objective`: the best w of an even grid (``CHOICES["shotless_tilt"]``, ties: the
    smaller), then golden section around it."""
    def profile(w):
        st = _stacked(evidence, w)
        return objective(st, w, best_offset(st, w))

    grid = [float(w) for w in np.linspace(0.0, 1.0, WEIGHT_STEPS + 1)]
    per = {w: -per_image(st, w, best_offset(st, w)) for w in grid for st in [_stacked(evidence, w)]}
    pick = choose(per, SimpleNamespace(weights=_stacked(evidence, 0.0)[3]), "shotless_tilt", level).chosen
    i = grid.index(pick)
    w, value = golden_minimum(profile, grid[max(i - 1, 0)], grid[min(i + 1, WEIGHT_STEPS)], GOLDEN_STEPS)
    best = pick if profile(pick) <= value else w
    return best, best_offset(evidence, best)


def fit_tilt(shots: SupportSet, side, refit, shots_weight: float, progress: bool = False, *, config: AdaptConfig):
    """:class:`Tilt` from refits (``refit(shots)``: ``adapt`` without this step) without groups of the classes with
    shots, each scored on the shots it left out and its own held-out shots; None unless 2 ≤ classes with shots < C."""
    C, labels = side.n_classes, shots.labels.numpy()
    with_shots = np.flatnonzero(np.bincount(labels, minlength=C) > 0)
    if with_shots.size == C or with_shots.size < 2:
        return None
    share_without = 1.0 - with_shots.size / C
    order = np.random.default_rng(side.config.seed).permutation(with_shots)   # groups of classes left out
    groups = [g for g in np.array_split(order, min(config.class_folds, order.size)) if g.size][:config.refits]
    folds, n, parts = [], len(groups), []   # parts: (p_kernel, p_linear, p_cosine, y, the classes without shots, share)
    for group in bar(groups, progress, desc="classes without shots: refits", unit="refit"):
        out = np.isin(labels, group)
        fit = refit(shots.subset(np.flatnonzero(~out)))
        shotless = ~np.isin(np.arange(C), labels[~out])   # the classes this refit had no shots of
        pk, pl, p0 = (predictor.proba(fit.heads, side.prototypes, side.config.kernel, shots.rows[out].float(),
                                      h).numpy() for h in ("kernel", "linear", "cosine"))
        pk_in, pl_in, y_in, p0_in = fit.held_out
        # each kind weighs by the deployed share of its classes; the folds are averaged
        parts += [(pk, pl, p0, labels[out], shotless, share_without / n),
                  (pk_in, pl_in, p0_in, y_in, shotless, (1.0 - share_without) / n)]
        folds.append((group.size, out.sum(), len(y_in)))
    found = [evidence(*p[:2], *p[3:]) for p in parts]
    w, delta = best_weight_and_offset(found, config.level)
    # output only (svgen.json fewshot.heads_vs_zero_shot): each head and the tilted mixture against zero-shot
    versus = heldout.compare([({"kernel": k, "linear": li, "mixture": tilt(mix(w, k, li), delta, u),
                                "cosine": z}, y, share) for k, li, z, y, u, share in parts], config)
    nll = {"untilted": objective(found, shots_weight, 0.0), "tilted": objective(found, w, delta)}
    record = records.shotless(C - with_shots.size, delta, w, shots_weight, nll, folds, config.class_folds)
    log.info("shots: %d of %d classes have none; the mixture at w = %.3g (the shots alone: %.3g), their "
             "probabilities × e^%.3g (held-out NLL %.4f → %.4f)", C - with_shots.size, C, w, shots_weight, delta,
             *record["held_out_nll"].values())
    return Tilt(w, delta, record, versus)
