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
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

import numpy as np

from svgen.adapt.config import DEFAULT


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
