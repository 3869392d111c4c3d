"""The selectable heads against zero-shot on the evidence a few-shot fit has: its held-out shots.

``adapt`` already scores every head on shots it did not see (the balanced folds' held-out shots, or exact
leave-one-out; with shots for only some classes also the refits that leave whole classes without shots,
:mod:`svgen.adapt.shotless`). The cosine head — plain CLIP, zero-shot — needs no refit, so it is scored on the
same images, and :func:`compare` records each head against it (``svgen.json`` ``fewshot.heads_vs_zero_shot``):
top-1, top-5 (the classes ``classify`` lists, :func:`svgen.heads.scoring.topk`) and NLL, each image
weighed as the fit weighed it (the deployed shares of classes without and with shots), with the paired difference
to the cosine head and its standard error (:func:`svgen.adapt.select.paired`). A head is *worse than zero-shot* where one
of the three is behind the cosine head's by more than ``level`` standard errors (:func:`svgen.adapt.select.behind`; NLL:
:func:`~svgen.adapt.select.ahead`, lower is better). The record is output only: ``svgen diagnose`` and ``svgen eval``
report it (:func:`svgen.evaluation.heldout.findings`); nothing in the fit reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from svgen.heads.calibration import PROB_FLOOR
from svgen.adapt.config import DEFAULT, AdaptConfig, config_or_default
from svgen.adapt.select import ahead, behind, paired


ZERO_SHOT = "cosine"
METRICS = ("acc1", "acc5", "nll")

Part = Tuple[Dict[str, np.ndarray], np.ndarray, float]   # ({head: M×C probabilities}, M labels, the part's weight)


def outcomes(p, y) -> Dict[str, np.ndarray]:
    """Per image: top-1 and top-5 hits (0/1) and ``−log p_y`` of probabilities ``p`` (M×C) against ``y``."""
    import torch

    from svgen.heads.scoring import topk

    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    hit = topk(torch.from_numpy(p), 5)[1].numpy() == y[:, None]
    return {"acc1": hit[:, 0].astype(np.float64), "acc5": hit.any(axis=1).astype(np.float64),
            "nll": -np.log(np.maximum(p[np.arange(y.size), y], PROB_FLOOR))}


def compare(parts: Sequence[Part], config: Optional[AdaptConfig] = None) -> Optional[dict]:
    """Every head of ``parts`` against :data:`ZERO_SHOT` (each part must have it): the weighted means, the paired
    differences with their standard errors, and ``worse_than_zero_shot`` — ``{head: [metric, …]}`` for the heads
    behind zero-shot by more than ``config.level`` standard errors. Each part's images share its weight equally.
    None without images."""
    level = config_or_default(config).level
    parts = [(probs, np.asarray(y), float(w)) for probs, y, w in parts if len(y) and w > 0]
    if not parts:
        return None
    heads = [h for h in parts[0][0] if h != ZERO_SHOT]
    share = np.concatenate([np.full(len(y), w / len(y)) for _, y, w in parts])
    share /= share.sum()
    per = {h: {m: np.concatenate([outcomes(probs[h], y)[m] for probs, y, _ in parts]) for m in METRICS}
           for h in [ZERO_SHOT] + heads}
    out = {"images": int(share.size), "heads": {h: {m: float(share @ per[h][m]) for m in METRICS} for h in per},
           "versus_zero_shot": {}, "worse_than_zero_shot": {}}
    for h in heads:
        diffs, worse = {}, []
        for m in METRICS:
            p = paired(per[h][m], per[ZERO_SHOT][m], share)
            diffs[m] = {"difference": p.difference, "standard_error": p.standard_error}
            if ahead(p, level) if m == "nll" else behind(p, level):
                worse.append(m)
        out["versus_zero_shot"][h] = diffs
        if worse:
            out["worse_than_zero_shot"][h] = worse
    out["rule"] = ("each head and the cosine head (zero-shot) on the fit's held-out shots, weighed as the fit weighs "
                   "them; a head is worse than zero-shot where its top-1 or top-5 is lower, or its NLL higher, by "
                   f"more than {'one standard error' if level == 1 else f'{level:g} standard errors'} of the paired "
                   "difference")
    return out


def shots_record(held: tuple, default_head: str, weight: Optional[float],
                 config: Optional[AdaptConfig] = None) -> Optional[dict]:
    """:func:`compare` on the held-out shots that chose the default head: ``held`` is ``(p_kernel, p_linear, y,
    p_cosine)`` (:attr:`svgen.adapt.shots.ShotFit.held_out`); the mixture is scored where it is the default."""
    pk, pl, y, p0 = held
    probs = {"kernel": pk, "linear": pl, ZERO_SHOT: p0}
    if default_head == "mixture" and weight is not None:
        probs["mixture"] = weight * pk + (1.0 - weight) * pl
    return compare([(probs, y, 1.0)], config)


# ----------------------------------------------------------------------------- the held-out shots

class Regime(Enum):
    """How a fit's shots are held out: balanced folds, exact leave-one-out (one shot per class), or not at all."""

    FOLDS = "balanced folds"
    LEAVE_ONE_OUT = "leave-one-out"
    NONE = "none"


@dataclass(frozen=True)
class Evidence:
    """The held-out shots of one fit, built once (:func:`evidence`): the regime, the ``(removed, scored)`` folds, the
    scored shots (``rows``, in the folds' order) and their ``labels``, the shots exact leave-one-out scores
    (``loo_rows``, None: all) and the fit's seed. Every choice of the shots stage is judged on it."""

    regime: Regime
    folds: tuple
    rows: np.ndarray
    labels: np.ndarray
    loo_rows: Optional[np.ndarray]
    seed: int
    weights: Optional[np.ndarray] = None

    @property
    def one_shot(self) -> bool:
        """One shot per class: the choices are judged on leave-one-out scores."""
        return self.regime is Regime.LEAVE_ONE_OUT

    @property
    def judges_zero_shot(self) -> bool:
        """Whether zero-shot is a candidate against a correction: not on leave-one-out with one shot per class, where
        each held-out image's class is left without any shot, so the scores judge a class without shots, not the
        deployed head (measured: zero-shot chosen there costs 17 points on pets and 7 on sun397 at one shot)."""
        return self.regime is Regime.FOLDS


def evidence(labels: np.ndarray, n_classes: int, config: AdaptConfig, seed: int) -> Evidence:
    """The held-out shots of ``labels``: balanced folds (:func:`scored_folds`, at most ``config.select_max`` scored)
    with exact leave-one-out of ``config.lda_loo_max`` shots beside; with one shot per class leave-one-out of
    ``config.select_max`` (:func:`shot_sample`); none without shots. One seed, the fit's."""
    y = np.asarray(labels, dtype=np.int64)
    if y.size == 0:
        return Evidence(Regime.NONE, (), y, y, None, seed)
    if np.bincount(y, minlength=n_classes).max() <= 1:
        sub = shot_sample(y, config.select_max, seed)
        rows = np.arange(y.size) if sub is None else sub
        return Evidence(Regime.LEAVE_ONE_OUT, (), rows, y[rows], sub, seed)
    folds = tuple(scored_folds(balanced_folds(y, seed, config.max_folds), y, seed, config.select_max))
    rows = np.concatenate([scored for _, scored in folds])
    return Evidence(Regime.FOLDS, folds, rows, y[rows], shot_sample(y, config.lda_loo_max, seed), seed)


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
