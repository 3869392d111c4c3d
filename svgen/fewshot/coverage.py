"""Shots for only some of the classes: the classes without shots keep their standing.

Labelled shots correct the zero-shot classifier near the shots. Where only some classes have shots, the correction
has no image of the others to push back with: an image of a class without shots that looks like a class with
shots is pulled to that class (the kernel head extrapolates the shot's label; the linear head's class means are
estimated for the classes with shots and only the text's prior mean stands for the others). On the dev data
(text-like prototypes, half of the classes with 4 shots) that cost 8 points of top-1 on caltech101 and 15 on sun397
against zero-shot, the classes without shots 15 and 39 (docs/fewshot.md, "Classes without shots").

The deployed default head is then the mixture (:mod:`svgen.calibration.mixture`) of the kernel and linear heads with
the classes without shots ``U`` tilted by one log-factor δ ≥ 0:

    p'(c | x) = p(c | x) · e^{δ·[c ∈ U]} / Σ_j p(j | x) · e^{δ·[j ∈ U]},     p = w·p_kernel + (1 − w)·p_linear

The weight ``w`` and δ are fitted together on held-out evidence of both regimes, the predictor rebuilt as it is
deployed (:func:`fit_tilt`):

* **classes without shots**: the classes with shots are split into :data:`CLASS_FOLDS` groups; for :data:`REFITS` of
  them the whole ``adapt`` is rerun without that group's shots, and the group's shots are scored by that predictor's
  two heads, for which their classes have none — images of classes without shots, with labels;
* **classes with shots**: the same refitted predictor's own held-out shots, both heads (its balanced folds, or with
  one shot per class its exact leave-one-out: :attr:`svgen.fewshot.adapt.ShotFit.held_out`).

Each fold tilts the classes that have no shots in it, and (w, δ) minimises the mean NLL of the two kinds of evidence
weighed by the deployed share of classes without shots and with them (each kind as the balanced mixture of classes
the deployed predictor will meet). The weight the shots alone choose sees only classes with shots: at one shot per
class it can deploy the linear head alone, whose classes without shots have only the text's prior mean, far below
zero-shot on them (dev data, caltech101, a quarter of the classes with one shot: 79.5% on the classes without shots
against zero-shot's 90.7%, the kernel head's 89.9%). For each ``w`` the NLL is convex in δ (its minimiser exact, by
bisection on the derivative); ``w`` is searched on a grid refined by golden section. With shots for every class
nothing changes (there is nothing to tilt, and the weight is the shots' own); ``add-classes`` adapts to the shots
again, so the classes it adds are classes without shots and (w, δ) is fitted for them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from svgen.calibration import mixture
from svgen.core.roots import convex_minimum
from svgen.core.support import SupportSet

log = logging.getLogger(__name__)

CLASS_FOLDS = 8        # the classes with shots in this many groups: a refit without one keeps 7/8 of the shots …
REFITS = 4             # … and this many of the groups are left out, one refit each (the cost: 4 × adapt)
MAX_OFFSET = 20.0      # δ's search range [0, MAX_OFFSET] (e^20: every class without shots above every other)
BISECTIONS = 60
WEIGHT_STEPS = 100     # the mixture weight's first search: w = 0, 0.01, …, 1 (then golden section)
GOLDEN_STEPS = 30
PROB_FLOOR = 1e-300


def class_groups(classes: np.ndarray, seed: int = 0, folds: int = CLASS_FOLDS, refits: int = REFITS) -> list:
    """``refits`` of the groups of the classes with shots split into ``folds`` of near-equal size (seeded order; at
    least one class each, so with fewer classes than ``folds`` one class per group)."""
    order = np.random.default_rng(seed).permutation(np.asarray(classes))
    return [g for g in np.array_split(order, min(folds, order.size)) if g.size][:refits]


@dataclass
class Evidence:
    """One kind of held-out evidence, reduced to what the tilted mixture's NLL needs, per image: each head's
    probability of the true class and of the tilted classes, and whether the true class is tilted."""

    kernel: np.ndarray        # p_kernel(y | x)
    linear: np.ndarray        # p_linear(y | x)
    mass_kernel: np.ndarray   # Σ_{c ∈ U} p_kernel(c | x)
    mass_linear: np.ndarray   # Σ_{c ∈ U} p_linear(c | x)
    tilted: np.ndarray        # [y ∈ U], as 0/1
    weight: float             # its share of the objective

    @property
    def size(self) -> int:
        return int(self.kernel.size)


def evidence(p_kernel: np.ndarray, p_linear: np.ndarray, y: np.ndarray, shotless: np.ndarray,
             weight: float) -> Evidence:
    """:class:`Evidence` of both heads' N×C probabilities of the same images with classes ``y``, ``shotless`` the C
    tilted classes."""
    y = np.asarray(y, dtype=np.int64)
    u = np.asarray(shotless, dtype=bool)
    rows = np.arange(y.size)
    pk, pl = np.asarray(p_kernel, dtype=np.float64), np.asarray(p_linear, dtype=np.float64)
    return Evidence(pk[rows, y], pl[rows, y], pk[:, u].sum(axis=1), pl[:, u].sum(axis=1), u[y].astype(np.float64),
                    float(weight))


def _stacked(evidence: list, w: float) -> tuple:
    """At weight ``w``, every image of ``evidence`` in one set of arrays: the mixture's ``−log p_y``, its mass ``P_U``
    on the tilted classes, ``u_y = [y ∈ U]``, and the image's share of the objective (its kind's weight over its
    kind's size)."""
    parts = [e for e in evidence if e.size]
    return (np.concatenate([-np.log(np.maximum(mixture.mix(w, e.kernel, e.linear), PROB_FLOOR)) for e in parts]),
            np.concatenate([mixture.mix(w, e.mass_kernel, e.mass_linear) for e in parts]),
            np.concatenate([e.tilted for e in parts]),
            np.concatenate([np.full(e.size, e.weight / e.size) for e in parts]))


def _value(stacked: tuple, delta: float) -> float:
    """The objective from :func:`_stacked` arrays: per image ``−log p_y − δ·u_y + log(1 − P_U + P_U·e^δ)``, the NLL of
    the tilted mixture (:func:`svgen.calibration.mixture.tilt`), weighed by its share."""
    nll, mass, tilted, share = stacked
    return float(share @ (nll - delta * tilted + np.log((1.0 - mass) + mass * math.exp(delta))))


def _slope(stacked: tuple, delta: float) -> float:
    """The derivative of :func:`_value` in δ: per image ``P_U·e^δ / (1 − P_U + P_U·e^δ) − u_y``, weighed by its
    share."""
    _, mass, tilted, share = stacked
    g = math.exp(delta)
    return float(share @ (mass * g / ((1.0 - mass) + mass * g) - tilted))


def objective(evidence: list, w: float, delta: float) -> float:
    """``Σ weight · mean NLL`` of the :class:`Evidence` list with the mixture at weight ``w`` tilted by δ."""
    return _value(_stacked(evidence, w), delta)


def slope(evidence: list, w: float, delta: float) -> float:
    """The derivative of :func:`objective` in δ."""
    return _slope(_stacked(evidence, w), delta)


def _offset(stacked: tuple) -> float:
    """:func:`best_offset` from :func:`_stacked` arrays."""
    return convex_minimum(lambda delta: _slope(stacked, delta), 0.0, MAX_OFFSET, BISECTIONS)


def best_offset(evidence: list, w: float) -> float:
    """δ in [0, :data:`MAX_OFFSET`] minimising :func:`objective` at weight ``w``; convex in δ, so 0 where the
    :func:`slope` at 0 is ≥ 0, the upper end where it is still ≤ 0 there, else the root of the slope by bisection."""
    return _offset(_stacked(evidence, w))


def best_weight_and_offset(evidence: list) -> tuple:
    """(w, δ) minimising :func:`objective`: the mixture at weight ``w`` ∈ [0, 1] tilted by δ ≥ 0. For each ``w`` the
    best δ is exact (:func:`best_offset`); the objective is not convex in ``w`` (the tilt's normaliser is concave in
    it), so ``w`` is the best of :data:`WEIGHT_STEPS` + 1 even steps (the first wins a tie: the smaller ``w``),
    refined by golden section between its neighbours."""
    def profile(w):
        st = _stacked(evidence, w)
        return _value(st, _offset(st))

    grid = np.linspace(0.0, 1.0, WEIGHT_STEPS + 1)
    values = [profile(w) for w in grid]
    i = int(np.argmin(values))
    best_w, best_v = float(grid[i]), values[i]
    lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, WEIGHT_STEPS)])
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = profile(a), profile(b)
    for _ in range(GOLDEN_STEPS):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = profile(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = profile(b)
    for w, v in ((a, fa), (b, fb)):
        if v < best_v:
            best_w, best_v = float(w), v
    return best_w, best_offset(evidence, best_w)


def fit_tilt(zero_shot, shots: SupportSet, side, refit, shots_weight: float, progress: bool = False):
    """(w, δ, record) for ``shots`` that leave some of ``side``'s classes without any — the deployed mixture's weight
    and its tilt — or None where every class has shots or fewer than two classes have them (no class can be left out
    and another kept). ``refit(shots)`` is ``adapt`` without this step (a :class:`svgen.fewshot.adapt.ShotFit`);
    ``zero_shot`` the heads it starts from; ``shots_weight`` the mixture weight the shots alone chose (recorded, and
    the untilted objective's); ``progress``: a progress bar over the refits."""
    from svgen.heads import predictor

    C = side.n_classes
    labels = shots.labels.numpy()
    with_shots = np.flatnonzero(np.bincount(labels, minlength=C) > 0)
    if with_shots.size == C or with_shots.size < 2:
        return None
    share_without = 1.0 - with_shots.size / C
    groups = class_groups(with_shots, side.config.seed)
    found, folds, n, parts = [], [], len(groups), []
    if progress:
        from tqdm.auto import tqdm

        groups = tqdm(groups, desc="classes without shots: refits", unit="refit")
    for group in groups:
        out = np.isin(labels, group)
        fit = refit(shots.subset(np.flatnonzero(~out)))
        shotless = np.ones(C, dtype=bool)
        shotless[np.unique(labels[~out])] = False
        rows = shots.rows[out].float()
        pk, pl, p0 = (predictor.proba(fit.heads, side.prototypes, side.config.kernel, rows, h).numpy()
                      for h in ("kernel", "linear", "cosine"))
        pk_in, pl_in, y_in, p0_in = fit.held_out
        parts.append((pk, pl, p0, labels[out], shotless, share_without / n))
        parts.append((pk_in, pl_in, p0_in, y_in, shotless, (1.0 - share_without) / n))
        # each kind's mean NLL weighs by the deployed share of its classes; the folds are averaged
        found += [evidence(pk, pl, labels[out], shotless, share_without / n),
                  evidence(pk_in, pl_in, y_in, shotless, (1.0 - share_without) / n)]
        folds.append({"classes_left_without_shots": int(group.size), "their_shots": int(out.sum()),
                      "held_out_shots_of_the_others": int(len(y_in))})
    w, delta = best_weight_and_offset(found)
    from svgen.heads import heldout

    # output only (svgen.json fewshot.heads_vs_zero_shot): each head and the deployed tilted mixture against zero-shot
    versus = heldout.compare([({"kernel": k, "linear": li, "mixture": mixture.tilt(mixture.mix(w, k, li), delta, u),
                                "cosine": z}, y, share) for k, li, z, y, u, share in parts])

    record = {"classes_without_shots": int(C - with_shots.size), "offset": float(delta), "mixture_weight": float(w),
              "mixture_weight_of_the_shots_alone": float(shots_weight),
              "held_out_nll": {"untilted": objective(found, shots_weight, 0.0), "tilted": objective(found, w, delta)},
              "folds": folds, "heads_vs_zero_shot": versus,
              "rule": "w·p_kernel + (1 − w)·p_linear with the classes without shots × e^δ, renormalised; (w, δ), "
                      "w in [0, 1] and δ ≥ 0, minimising the NLL of (a) the shots of each of "
                      f"{n} groups of 1/{CLASS_FOLDS} of the classes with shots, scored by adapt rerun without that "
                      "group's shots, and (b) that rerun's own held-out shots, weighed by the deployed shares of "
                      "classes without and with shots"}
    log.info("shots: %d of %d classes have none; the mixture at w = %.3g (the shots alone: %.3g), their "
             "probabilities × e^%.3g (held-out NLL %.4f → %.4f)", C - with_shots.size, C, w, shots_weight, delta,
             record["held_out_nll"]["untilted"], record["held_out_nll"]["tilted"])
    return w, delta, record
