"""Every adaptive choice, made one way: :func:`choose` among candidates on held-out images, by the table
:data:`CHOICES`, with one paired test (:func:`behind`) at ``AdaptConfig.level``; docs/adaptation.md, "The choices"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Hashable, Mapping, Optional, Tuple

import numpy as np
import torch

from svgen.heads.calibration import PROB_FLOOR
from svgen.heads.scoring import topk
from svgen.state import Paired


def paired(candidate, baseline, weights=None) -> Paired:
    """The paired comparison of per-image scores (correct 0/1, top-5 hits, or −NLL: larger is better). ``weights``
    (per image, any scale) weigh the images; SE = √(n/(n−1) · Σ wᵢ²(dᵢ − d̄)²) with Σw = 1, which is s/√n unweighted."""
    a, b = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    n, d = a.shape[0], a - b
    if weights is None:
        se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        return Paired(float(a.mean()), float(b.mean()), float(d.mean()), se, int(n))
    w = np.asarray(weights, np.float64) / np.sum(weights)
    mean = float(w @ d)
    se = math.sqrt(n / (n - 1) * float(w ** 2 @ (d - mean) ** 2)) if n > 1 else 0.0
    return Paired(float(w @ a), float(w @ b), mean, se, int(n))


TIE = 1e-9   # relative: a difference of exactly ``level`` SE in exact arithmetic is a tie after rounding too


def behind(p: Paired, level: float) -> bool:
    """The one test: the candidate is behind the baseline by more than ``level`` SE (exactly ``level`` SE is not)."""
    return p.difference < -level * p.standard_error * (1 + TIE)


def ahead(p: Paired, level: float) -> bool:
    """:func:`behind` with the roles swapped: the baseline is behind the candidate."""
    return p.difference > level * p.standard_error * (1 + TIE)


class Score(Enum):
    """What a held-out image contributes to a candidate's mean, larger is better: its top-1 or top-5 hit, or −NLL."""

    TOP1 = "top-1"
    TOP5 = "top-5"
    NLL = "NLL"

    def per_image(self, outputs, labels) -> np.ndarray:
        """Per image of ``outputs`` (M×C scores; probabilities for NLL) against ``labels``: 0/1 hits, or ``log p_y``."""
        out, y = np.asarray(outputs, dtype=np.float64), np.asarray(labels, dtype=np.int64)
        if self is Score.NLL:
            return np.log(np.maximum(out[np.arange(y.size), y], PROB_FLOOR))
        if self is Score.TOP1:
            return (out.argmax(axis=1) == y).astype(np.float64)
        return (topk(torch.from_numpy(out), 5)[1].numpy() == y[:, None]).any(axis=1).astype(np.float64)


class Accept(Enum):
    """How :func:`behind` accepts a candidate; the first is zero-shot (or nearest it) and every tie goes earlier."""

    BEST = "the best mean (zero-shot among the candidates, so no test is needed)"
    UNLESS_BEHIND = "the best other candidate, unless it is behind zero-shot"
    AHEAD = "the best other candidate, only where the first is behind it and it is not behind the first on the guards"
    NEAREST_NOT_BEHIND = "the candidate nearest zero-shot that is not behind the best"


@dataclass(frozen=True)
class ChoiceRule:
    """One row of :data:`CHOICES`: what is chosen, among what (in tie order), scored how, accepted how, on what."""

    chosen: str
    candidates: str
    score: Score
    accept: Accept
    evidence: str
    where: str
    guards: Tuple[Score, ...] = ()
    continuous: bool = False   # a convex minimum over an interval, not a pick among candidates (no choose())
    first: str = "zero-shot"   # what the first candidate is, in the words of choose()'s why


FOLDS_OR_LOO = "the balanced folds' held-out shots; one shot per class: leave-one-out"
LOO = "exact leave-one-out (at most lda_loo_max shots; one shot per class: select_max)"
CHOICES: Dict[str, ChoiceRule] = {
    "kernel": ChoiceRule("the kernel head's σ × c, or zero-shot (the correction refused)", "zero-shot, then σ × c by "
                         "larger c, then larger σ; one shot per class: Tip-Adapter's β, c alone, without zero-shot",
                         Score.TOP1, Accept.UNLESS_BEHIND, FOLDS_OR_LOO, "residual.py"),
    "lda": ChoiceRule("the LDA head's shrinkage γ (× prior strength κ)",
                      "γ × κ by larger γ, then larger κ (zero-shot enters the linear head as α = 0)",
                      Score.TOP1, Accept.NEAREST_NOT_BEHIND, LOO, "lda.py"),
    "lda_prior": ChoiceRule("the LDA head's prior strength κ at its γ", "the κ not behind the best (γ, κ), larger κ "
                            "first", Score.TOP1, Accept.BEST, LOO, "lda.py"),
    "alpha": ChoiceRule("the linear head's weight α on the LDA logits", "α = 0 (zero-shot), then the larger α; one "
                        "shot per class: the LDA head alone", Score.TOP1, Accept.BEST, FOLDS_OR_LOO, "lda.py"),
    "kernel_logits": ChoiceRule("the kernel head's kind of logits", "log (log charged for unseen votes ≤ 0), score, "
                                "floored", Score.NLL, Accept.BEST, FOLDS_OR_LOO, "temperatures.py"),
    "kernel_floor": ChoiceRule("ε of the floored kernel logits", "kernel_floors by larger ε (nearer log p₀)",
                               Score.NLL, Accept.BEST, FOLDS_OR_LOO, "temperatures.py"),
    "temperatures": ChoiceRule("each head's temperature T", "T > 0", Score.NLL, Accept.BEST,
                               "linear: leave-one-out; kernel: as its logit kind", "temperatures.py", continuous=True),
    "mixture_weight": ChoiceRule("the default head's weight w of the kernel head", "w in [0, 1], w = 1 first",
                                 Score.NLL, Accept.BEST, FOLDS_OR_LOO, "temperatures.py", continuous=True),
    "shotless_tilt": ChoiceRule("the mixture's w and tilt δ of the classes without shots", "w = 0, 0.01, …, 1 (each "
                                "at its best δ ≥ 0), then a golden-section refinement", Score.NLL, Accept.BEST,
                                "refits without groups of classes, weighed by the deployed shares of classes without "
                                "and with shots", "shotless.py"),
    "default_head": ChoiceRule("the default head", "the mixture at its weight w (the head w picks where w is 0 or 1), "
                               "then the other heads, the one whose top-1 agrees more with zero-shot's first",
                               Score.TOP1, Accept.AHEAD, FOLDS_OR_LOO, "shots.py", guards=(Score.TOP5, Score.NLL),
                               first="the mixture"),
    "pool": ChoiceRule("whether a pool is kept with shots (and whether the linear head named alone keeps its own "
                       "factor)", "the inductive heads, then the pool-adapted heads", Score.TOP1, Accept.AHEAD,
                       "each fold's held-out shots as unlabelled pool members", "gate.py",
                       guards=(Score.TOP5, Score.NLL)),
    "pool_halves": ChoiceRule("whether a pool is kept without shots", "the inductive default head, then the linear "
                              "head adapted on the other half", Score.TOP1, Accept.AHEAD, "two random halves of the "
                              "pool, each scored against the other half's own posterior class", "gate.py",
                              guards=(Score.TOP5,)),
    "pool_weight": ChoiceRule("the power a of the pool's likelihood on a head kept with shots", "a ≥ 0, a = 0 first",
                              Score.NLL, Accept.BEST, "each fold's held-out shots (cross-fitted for the check)",
                              "gate.py", continuous=True),
}


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` chose (key, index, mean), the best, the chosen (or best) against zero-shot, and why."""

    name: str
    chosen: Hashable
    index: int
    mean: float
    best: Hashable
    versus_zero_shot: Optional[Paired]
    means: Dict[Hashable, float]
    why: str
    not_behind: Tuple[Hashable, ...] = ()   # NEAREST_NOT_BEHIND: every candidate not behind the best, in order

    @property
    def adapted(self) -> bool:
        """Whether a candidate other than zero-shot (the first) was chosen."""
        return self.index != 0


def choose(candidates: Mapping[Hashable, Any], evidence, criterion: str, level: float) -> Choice:
    """The choice ``CHOICES[criterion]`` among ``candidates`` ({key: per-image scores (1-D, larger better), M×C
    outputs, or for guards {Score: either}}, zero-shot first, then nearest zero-shot first: the tie order), on
    ``evidence`` (``labels`` for M×C outputs; ``weights`` per image or None), accepted by the paired test at ``level``."""
    rule = CHOICES[criterion]
    keys, weights = list(candidates), getattr(evidence, "weights", None)
    per_image = lambda v, s: v if np.ndim(v) == 1 else s.per_image(v, evidence.labels)  # noqa: E731  (1-D, or M×C)
    scores = {k: {s: np.asarray(per_image(v[s] if isinstance(v, Mapping) else v, s), dtype=np.float64)
                  for s in ((rule.score, *rule.guards) if isinstance(v, Mapping) else (rule.score,))}
              for k, v in candidates.items()}
    means = {k: float(scores[k][rule.score].mean() if weights is None
                      else np.asarray(weights, np.float64) @ scores[k][rule.score] / np.sum(weights)) for k in keys}
    pool = keys if rule.accept in (Accept.BEST, Accept.NEAREST_NOT_BEHIND) or len(keys) == 1 else keys[1:]
    best = pool[int(np.argmax([means[k] for k in pool]))]   # the first of the best: nearest zero-shot
    test = lambda a, b, s=rule.score: paired(scores[a][s], scores[b][s], weights)  # noqa: E731
    chosen, why, ok = best, f"{rule.accept.value}: {best!r}", ()
    if rule.accept is Accept.NEAREST_NOT_BEHIND:
        ok = tuple(k for k in keys if not behind(test(k, best), level))
        chosen = ok[0]
        why = f"{chosen!r}, the nearest zero-shot not behind the best {best!r} by more than {level:g} SE"
    elif rule.accept is Accept.UNLESS_BEHIND and best != keys[0] and behind(test(best, keys[0]), level):
        chosen, why = keys[0], f"the best {best!r} is behind zero-shot by more than {level:g} SE"
    elif rule.accept is Accept.AHEAD and best != keys[0]:
        failed = ([rule.score.value] if not ahead(test(best, keys[0]), level) else []) + [
            s.value for s in rule.guards if behind(test(best, keys[0], s), level)]
        if failed:
            chosen, why = keys[0], f"the best {best!r} fails on {', '.join(failed)} against {rule.first} at {level:g} SE"
    versus = test(chosen if chosen != keys[0] else best, keys[0]) if len(keys) > 1 else None
    return Choice(criterion, chosen, keys.index(chosen), means[chosen], best, versus, means, why, ok)


def choices_table() -> str:
    """:data:`CHOICES` as the markdown table docs/adaptation.md holds (a test checks that it does)."""
    rows = ["| choice | chosen | candidates (tie order: nearest zero-shot first) | score | accepted | judged on | where |",
            "|---|---|---|---|---|---|---|"]
    for name, r in CHOICES.items():
        score = r.score.value + (f" (not behind on {', '.join(g.value for g in r.guards)})" if r.guards else "")
        accept = "a convex minimum (no candidates)" if r.continuous else r.accept.value
        rows.append(f"| `{name}` | {r.chosen} | {r.candidates} | {score} | {accept} | {r.evidence} | `{r.where}` |")
    return "\n".join(rows) + "\n"
