"""The held-out shots of a fit (:class:`HeldOut`; docs/adaptation.md), each head against zero-shot on them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from svgen import records
from svgen.heads.calibration import mix
from svgen.adapt.config import DEFAULT, AdaptConfig
from svgen.adapt.select import Score, ahead, behind, paired


ZERO_SHOT = "cosine"
METRICS = ("acc1", "acc5", "nll")

Part = Tuple[Dict[str, np.ndarray], np.ndarray, float]   # ({head: M×C probabilities}, M labels, the part's weight)


def outcomes(p, y) -> Dict[str, np.ndarray]:
    """Per image of probabilities ``p`` against ``y``: what every choice scores (:class:`~svgen.adapt.select.Score`)."""
    return {"acc1": Score.TOP1.per_image(p, y), "acc5": Score.TOP5.per_image(p, y), "nll": -Score.NLL.per_image(p, y)}


def compare(parts: Sequence[Part], config: AdaptConfig) -> Optional[dict]:
    """Every head of ``parts`` against :data:`ZERO_SHOT` (in every part): top-1, top-5 and NLL means, the paired
    differences, and the heads behind it by more than ``config.level`` SE on one (NLL: ahead). Each part's images
    share its weight. None without images."""
    level = config.level
    parts = [(probs, np.asarray(y), float(w)) for probs, y, w in parts if len(y) and w > 0]
    if not parts:
        return None
    heads = [h for h in parts[0][0] if h != ZERO_SHOT]
    share = np.concatenate([np.full(len(y), w / len(y)) for _, y, w in parts])
    share /= share.sum()
    per = {h: {m: np.concatenate([outcomes(probs[h], y)[m] for probs, y, _ in parts]) for m in METRICS}
           for h in [ZERO_SHOT] + heads}
    versus = {h: {m: paired(per[h][m], per[ZERO_SHOT][m], share) for m in METRICS} for h in heads}
    worse = {h: [m for m, p in v.items() if (ahead if m == "nll" else behind)(p, level)] for h, v in versus.items()}
    means = {h: {m: float(share @ per[h][m]) for m in METRICS} for h in per}
    return records.versus_zero_shot(int(share.size), means, versus, worse, level)


def shots_record(held: tuple, default_head: str, weight: Optional[float], config: AdaptConfig) -> Optional[dict]:
    """:func:`compare` on ``held`` = (p_kernel, p_linear, y, p_cosine); the mixture where it is the default."""
    pk, pl, y, p0 = held
    probs = {"kernel": pk, "linear": pl, ZERO_SHOT: p0}
    if default_head == "mixture" and weight is not None:
        probs["mixture"] = mix(weight, pk, pl)
    return compare([(probs, y, 1.0)], config)


class Regime(Enum):
    """How a fit's shots are held out: balanced folds, exact leave-one-out (one shot per class), or not at all."""

    FOLDS = "balanced folds"
    LEAVE_ONE_OUT = "leave-one-out"
    NONE = "none"


@dataclass(frozen=True)
class HeldOut:
    """The held-out shots of one fit (:func:`evidence`): ``(removed, scored)`` folds, the scored ``rows`` (the folds'
    order) and ``labels``, the shots exact leave-one-out scores (``loo_rows``, None: all), the fit's seed."""

    regime: Regime
    folds: tuple
    rows: np.ndarray
    labels: np.ndarray
    loo_rows: Optional[np.ndarray]
    seed: int

    @property
    def one_shot(self) -> bool:   # one shot per class: the choices are judged on leave-one-out scores
        return self.regime is Regime.LEAVE_ONE_OUT

    @property
    def judges_zero_shot(self) -> bool:
        """Whether zero-shot is a candidate against a correction: not with one shot per class (docs/adaptation.md)."""
        return self.regime is Regime.FOLDS


def evidence(labels: np.ndarray, n_classes: int, config: AdaptConfig, seed: int) -> HeldOut:
    """The held-out shots of ``labels`` at the fit's seed: balanced folds, or with one shot per class leave-one-out;
    none without shots (docs/adaptation.md, "The held-out shots")."""
    y = np.asarray(labels, dtype=np.int64)
    if y.size == 0:
        return HeldOut(Regime.NONE, (), y, y, None, seed)
    if np.bincount(y, minlength=n_classes).max() <= 1:
        sub = shot_sample(y, config.select_max, seed)
        rows = np.arange(y.size) if sub is None else sub
        return HeldOut(Regime.LEAVE_ONE_OUT, (), rows, y[rows], sub, seed)
    folds = tuple(scored_folds(balanced_folds(y, seed, config.max_folds), y, seed, config.select_max))
    rows = np.concatenate([scored for _, scored in folds])
    return HeldOut(Regime.FOLDS, folds, rows, y[rows], shot_sample(y, config.lda_loo_max, seed), seed)


def balanced_folds(y: np.ndarray, seed: int = 0, max_folds: int = DEFAULT.max_folds) -> list:
    """Fold f holds out the f-th shot (seeded order) of every class with two or more; at most ``max_folds``."""
    rng = np.random.default_rng(seed)
    order = [rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)]
    folds = [np.array(sorted(v[f] for v in order if len(v) > 1 and f < len(v)), dtype=np.int64)
             for f in range(min(max(len(v) for v in order), max_folds))]
    return [f for f in folds if f.size]


def scored_folds(folds: list, y: np.ndarray, seed: int = 0, n_max: Optional[int] = None) -> list:
    """``(removed, scored)`` per fold used, at most ``n_max`` shots scored in all (docs/adaptation.md)."""
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
