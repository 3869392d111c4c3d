"""Held-out shots for the adaptive choices: the fold scheme, the shot sample and the paired acceptance test.

Every choice made from labelled shots (the kernel head's σ and ridge, the LDA head's γ and κ, the linear head's α,
the mixture's weight, the temperatures, keeping a correction at all) is scored on shots the predictor did not see,
with the predictor as deployed: refitted on **all** the other shots of **all** classes, each held-out shot scored
against all C classes with the zero-shot prior on, as a query is. For speed the held-out shots are subsampled,
never the classes (:func:`balanced_folds` with ``n_max``, :func:`shot_sample`).

A correction is accepted by one paired test (:func:`paired_test`): on the same held-out shots it may not be behind
the baseline (zero-shot) by more than one standard error of the paired difference; a tie keeps it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Optional

import numpy as np

SELECT_MAX = 1024   # held-out shots scored per choice (subsampled above this; every shot still fits each refit)
MAX_FOLDS = 4       # held-out folds (each one shot per class; the choice needs no more)


def balanced_folds(y: np.ndarray, seed: int = 0, max_folds: int = MAX_FOLDS, n_max: Optional[int] = None) -> list:
    """Folds that each hold out one shot of every class with two or more: fold f the f-th shot (in a seeded
    order) of each class that has more than f; as many folds as the largest class has shots, at most
    ``max_folds``. Every class loses one shot at once, so a held-out image's class is not put at a
    disadvantage against the others, as plain leave-one-out would.

    ``n_max``: at most that many held-out shots in all. Each fold then keeps the shots of a contiguous run of
    classes in one seeded class order, successive folds successive runs, so the held-out shots cover as many
    classes as they can. Only the *scored* shots are subsampled: a fold's predictor is still refitted on every
    other shot of every class."""
    rng = np.random.default_rng(seed)
    order = {c: rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)}
    folds = []
    for f in range(min(max(len(v) for v in order.values()), max_folds)):
        held = np.array(sorted(v[f] for v in order.values() if len(v) > 1 and f < len(v)), dtype=np.int64)
        if held.size:
            folds.append(held)
    total = sum(f.size for f in folds)
    if n_max is None or total <= n_max:
        return folds
    sub = np.random.default_rng(seed + 1)
    classes = sub.permutation(np.unique(y))
    rank = np.empty(int(classes.max()) + 1, dtype=np.int64)
    rank[classes] = np.arange(classes.size)
    per = max(1, n_max // len(folds))
    out = []
    for i, held in enumerate(folds):
        r = (rank[y[held]] - i * per) % classes.size      # the fold's run of classes starts at i·per
        out.append(np.sort(held[r < per]))
    return [f for f in out if f.size]


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
    order = np.lexsort((cls_rank, within))
    return np.sort(order[:n_max])


class Reason(Enum):
    """Why :func:`paired_test` decided as it did."""

    NOT_BEHIND = "not behind the baseline by more than 1 SE of the paired difference on the held-out shots"
    BEHIND = "behind the baseline by more than 1 SE of the paired difference on the held-out shots"
    NO_EVIDENCE = "no held-out shot can judge it (one shot per class): kept as stated"


@dataclass(frozen=True)
class Evidence:
    """The paired comparison a :class:`Decision` rests on (accuracies on the same held-out shots)."""

    candidate_accuracy: float
    baseline_accuracy: float
    difference: float
    standard_error: float
    shots_compared: int


@dataclass(frozen=True)
class Decision:
    """An accepted or refused candidate, why, and on what evidence. Written to the record, never read back."""

    kept: bool
    reason: Reason
    evidence: Optional[Evidence] = None

    def to_json(self) -> dict:
        """The record ``svgen.json`` has carried since format 3 (the reason is ``adopted`` with the rule)."""
        out = {"adopted": self.kept}
        if self.evidence is not None:
            e = asdict(self.evidence)
            out.update(held_out_acc=e["candidate_accuracy"], zero_shot_acc=e["baseline_accuracy"],
                       difference=e["difference"], standard_error=e["standard_error"],
                       shots_compared=e["shots_compared"])
        return {**out, "rule": ACCEPTANCE_RULE}


# the rule as svgen.json records it (unchanged since format 3: the folds each hold out one shot per class)
ACCEPTANCE_RULE = ("adapted unless its accuracy on held-out shots (one per class at a time) is below zero-shot's "
                   "by more than 1 SE (paired)")


def paired_test(candidate: np.ndarray, baseline: np.ndarray) -> Decision:
    """The one acceptance test: per-shot correctness (booleans) of the candidate and of the baseline on the same
    held-out shots; kept unless the mean paired difference is below −1 standard error."""
    d = np.asarray(candidate, dtype=float) - np.asarray(baseline, dtype=float)
    n = d.shape[0]
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    mean = float(d.mean())
    kept = mean >= -se
    return Decision(kept, Reason.NOT_BEHIND if kept else Reason.BEHIND,
                    Evidence(float(np.mean(candidate)), float(np.mean(baseline)), mean, se, n))
