"""How every adaptive choice is made: the settings (:class:`AdaptConfig`), the held-out shots, and one paired test.

Every choice labelled shots or an unlabelled pool make is scored on images the predictor did not fit, with the
predictor as deployed (refitted on every other shot of every class, each held-out shot scored against all C
classes), and zero-shot is always a candidate. One test decides: :func:`behind` — a predictor is behind another when
the mean paired difference of their per-image scores on the same images is below −``level`` standard errors
(``AdaptConfig.level``, 1 by default). A tie (exactly ``level`` SE) is not behind. A correction is kept unless it is
behind zero-shot; a pool is kept when the inductive heads are behind it on top-1 and it is not behind them on top-5
and NLL. docs/adaptation.md states the rule and the solvers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Optional, Tuple

import numpy as np

from svgen.errors import SvgenError


@dataclass(frozen=True)
class AdaptConfig:
    """The grids, sizes and the one level of every adaptive choice (``SVGClassifier(adapt_config=...)``).

    level: the paired test's level in standard errors (:func:`behind`).
    select_max, max_folds: held-out shots scored per choice (subsampled above, never classes) and held-out folds.
    sigma_factors × ridges: the kernel head's σ (× the median distance between shots) and ridge c; one_shot_beta and
    one_shot_ridge its setting with one shot per class (Tip-Adapter's β = 5.5, σ = 1/√β). select_basis, dense_max,
    nystrom_basis: the Nyström sizes of the folds' refits and of the deployed solve.
    lda_shrinkage × lda_prior: the LDA head's γ and κ; lda_loo_max the shots its leave-one-out scores;
    lda_prior_one_shot: κ with one shot per class (zero-shot CLIP is worth about 4 shots, Radford et al. 2021 fig. 7).
    alphas: the linear head's LDA weight α (× s; 0 is zero-shot). kernel_floors: ε of the floored kernel logits.
    class_folds, refits: groups of classes with shots and how many are left out (shots for only some classes).
    neighbours … max_escalations: the pool's transduction (TransCLIP's k = 3; rounds, fixed-point steps, κ of the
    prior mean, the smallest pool per class, the agreement that stops the rounds, β's escalation). pool_trust: λ of
    the label estimate ``λ·p_pool + (1 − λ)·p_cosine`` under which a zero-shot pool's heads may not expect a higher
    NLL than the cosine head's (:func:`svgen.transductive.solve.nll_guard`; in (0, 1]).
    max_queries, max_logits: the text queries and the queries × classes that fit a temperature.
    """

    level: float = 1.0
    select_max: int = 1024
    max_folds: int = 4
    sigma_factors: Tuple[float, ...] = (0.35, 0.5, 0.7, 1.0)
    ridges: Tuple[float, ...] = tuple(float(10.0 ** p) for p in np.arange(-3.0, 1.51, 0.5))
    one_shot_beta: float = 5.5
    one_shot_ridge: float = 1.0
    select_basis: int = 1024
    dense_max: int = 4096
    nystrom_basis: int = 1536
    lda_shrinkage: Tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)
    lda_prior: Tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
    lda_loo_max: int = 512
    lda_prior_one_shot: float = 4.0
    alphas: Tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    kernel_floors: Tuple[float, ...] = (0.1, 0.3, 0.5, 0.9)
    class_folds: int = 8
    refits: int = 4
    neighbours: int = 3
    rounds: int = 10
    steps: int = 5
    prior_pseudo_images: float = 1.0
    min_pool_per_class: float = 1.0
    stable: float = 0.999
    escalate: float = 4.0
    max_escalations: int = 4
    pool_trust: float = 0.7
    max_queries: int = 2048
    max_logits: int = 4_000_000

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                if not v or any(not math.isfinite(x) or x < 0 for x in v):
                    raise SvgenError(f"AdaptConfig.{f.name} must be a non-empty tuple of finite values >= 0, got {v!r}")
            elif not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise SvgenError(f"AdaptConfig.{f.name} must be a finite number >= 0, got {v!r}")
        if min(self.select_max, self.max_folds, self.lda_loo_max, self.class_folds, self.rounds, self.steps) < 1:
            raise SvgenError("AdaptConfig: select_max, max_folds, lda_loo_max, class_folds, rounds and steps must be >= 1")
        if not 0.0 < self.pool_trust <= 1.0:
            raise SvgenError(f"AdaptConfig.pool_trust must be in (0, 1], got {self.pool_trust!r}")

    def changed(self) -> dict:
        """The settings that differ from the defaults (what ``svgen.json`` records)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


DEFAULT = AdaptConfig()


def config_or_default(config: Optional[AdaptConfig]) -> AdaptConfig:
    if config is None:
        return DEFAULT
    if not isinstance(config, AdaptConfig):
        raise SvgenError(f"adapt_config must be an svgen.AdaptConfig, got {type(config).__name__}")
    return config


# ----------------------------------------------------------------------------- the held-out shots

def balanced_folds(y: np.ndarray, seed: int = 0, max_folds: int = DEFAULT.max_folds) -> list:
    """Folds that each hold out one shot of every class with two or more (fold f: the f-th shot of each class in a
    seeded order), as many as the largest class has shots, at most ``max_folds``, so no held-out image's class is
    short against the others."""
    rng = np.random.default_rng(seed)
    order = {c: rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)}
    folds = []
    for f in range(min(max(len(v) for v in order.values()), max_folds)):
        held = np.array(sorted(v[f] for v in order.values() if len(v) > 1 and f < len(v)), dtype=np.int64)
        if held.size:
            folds.append(held)
    return folds


def scored_folds(folds: list, y: np.ndarray, seed: int = 0, n_max: Optional[int] = None) -> list:
    """``(removed, scored)`` for each fold used: a fold's refit leaves out every shot of the fold, so every class stays
    one shot short at once, and at most ``n_max`` shots are scored in all. Above ``n_max``: the first folds that hold
    ``n_max`` shots, at least one; a single fold larger than that scores the shots of ``n_max`` classes (one seeded
    order) and still leaves out all of its shots."""
    if n_max is None or sum(f.size for f in folds) <= n_max:
        return [(f, f) for f in folds]
    used = folds[:max(1, n_max // max(f.size for f in folds))]   # more than one: each fits n_max / 2
    if used[0].size <= n_max:
        return [(f, f) for f in used]
    fold = used[0]
    classes = np.random.default_rng(seed + 1).permutation(np.unique(y[fold]))[:n_max]
    return [(fold, fold[np.isin(y[fold], classes)])]


def shot_sample(labels: np.ndarray, n_max: int, seed: int = 0) -> Optional[np.ndarray]:
    """At most ``n_max`` shots (sorted indices) spread over the classes: every class's first shot (in a seeded order),
    then every class's second, ..., classes in a seeded order. None: all of them."""
    labels = np.asarray(labels)
    if labels.shape[0] <= n_max:
        return None
    rng = np.random.default_rng(seed)
    within = np.empty(labels.shape[0], dtype=np.int64)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        within[rng.permutation(idx)] = np.arange(idx.size)
    cls_rank = rng.permutation(int(labels.max()) + 1)[labels]
    return np.sort(np.lexsort((cls_rank, within))[:n_max])


# ----------------------------------------------------------------------------- the one test

@dataclass(frozen=True)
class Paired:
    """Two predictors' per-image scores on the same images: their (weighted) means, the mean difference
    (candidate − baseline) and its standard error, and the number of images."""

    candidate: float
    baseline: float
    difference: float
    standard_error: float
    n: int


def paired(candidate, baseline, weights=None) -> Paired:
    """The paired comparison of per-image scores (correct 0/1, top-5 hits, or −NLL: larger is better). ``weights``
    (per image, any scale) weigh the images; SE = √(n/(n−1) · Σ wᵢ²(dᵢ − d̄)²) with Σw = 1, which is s/√n unweighted."""
    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    n = a.shape[0]
    d = a - b
    if weights is None:
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        return Paired(float(a.mean()), float(b.mean()), float(d.mean()), se, int(n))
    w = np.asarray(weights, np.float64) / np.sum(weights)
    mean = float(w @ d)
    se = math.sqrt(n / (n - 1) * float(w ** 2 @ (d - mean) ** 2)) if n > 1 else 0.0
    return Paired(float(w @ a), float(w @ b), mean, se, int(n))


TIE = 1e-9   # relative: a difference of exactly ``level`` SE in exact arithmetic is a tie after rounding too


def behind(p: Paired, level: float) -> bool:
    """The one acceptance test: the candidate is behind the baseline by more than ``level`` standard errors (a tie,
    exactly ``level`` SE, is not behind)."""
    return p.difference < -level * p.standard_error * (1 + TIE)


def ahead(p: Paired, level: float) -> bool:
    """:func:`behind` with the roles swapped: the baseline is behind the candidate."""
    return p.difference > level * p.standard_error * (1 + TIE)


# ----------------------------------------------------------------------------- decisions

@dataclass(frozen=True)
class Decision:
    """An accepted or refused candidate, why (a member of a ``Reason`` enum), on what evidence, and the cause in
    words where it was refused. ``to_json()`` writes the record (output only, never read back to steer); the
    reason's enum knows how its records look (its ``record`` method)."""

    kept: bool
    reason: Enum
    evidence: Any = None
    why: Optional[str] = None
    level: float = DEFAULT.level

    def to_json(self) -> dict:
        return type(self.reason).record(self)


def acceptance_rule(level: float = DEFAULT.level) -> str:
    """The rule as ``svgen.json`` records it for a shot correction (at level 1, the text of format 3)."""
    return ("adapted unless its accuracy on held-out shots (one per class at a time) is below zero-shot's "
            f"by more than {level:g} SE (paired)")


class ShotReason(Enum):
    """Why a correction from labelled shots was kept or refused (:func:`shot_test`)."""

    NOT_BEHIND = "not behind zero-shot on the held-out shots"
    BEHIND = "behind zero-shot on the held-out shots"
    NO_EVIDENCE = "no held-out shot can judge it (one shot per class): kept as stated"

    @staticmethod
    def record(decision: Decision) -> dict:
        out = {"adopted": decision.kept}
        e = decision.evidence
        if e is not None:
            out.update(held_out_acc=e.candidate, zero_shot_acc=e.baseline, difference=e.difference,
                       standard_error=e.standard_error, shots_compared=e.n)
        return {**out, "rule": acceptance_rule(decision.level)}


def shot_test(candidate_correct, zero_shot_correct, level: float = DEFAULT.level) -> Decision:
    """A correction against zero-shot on the same held-out shots (per-shot correctness): kept unless behind."""
    p = paired(candidate_correct, zero_shot_correct)
    kept = not behind(p, level)
    return Decision(kept, ShotReason.NOT_BEHIND if kept else ShotReason.BEHIND, p, level=level)
