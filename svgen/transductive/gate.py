"""Whether an unlabelled pool may change the heads: a held-out check before the transduction is kept.

The transduction (:mod:`svgen.transductive.solve`) always finds *some* structure in a pool; whether it is
the classes' is a question for evidence the pool's own solve has not seen. The deployed heads change
only when that evidence says the pool-adapted predictor is better; otherwise the inductive heads stay
exactly, and ``transductive.fallback`` says why.

**With labelled shots: held-out shots become pool images.** The shots are split into folds (with three or
more shots per class, one shot of every class per fold; otherwise two folds, half of each class's shots in
each, and with one shot per class half of the classes' shots: :func:`shot_folds`). For each fold the
predictor is rebuilt as it would be deployed — from the zero-shot head, adapted to the shots not in
the fold with the fit's own rules — and the held-out shots join the pool *unlabelled*, exactly like the
queries a user classifies. Both predictors, inductive and pool-adapted, are then scored on the
held-out shots (every shot is held out once):

* the candidate is the inductive default head times the pool's Gaussian class likelihood to a power,
  ``p(x) ∝ p⁰(x)·exp(a·(x̂ W_Gᵀ + b_G))`` (:class:`svgen.state.PoolFactor`): p⁰ each fold's own default head, as
  deployed, and ``a ≥ 0`` minimising the NLL of held-out shots (:func:`fit_pool_weight`; convex; a = 0 is the
  inductive head), each fold's ``a`` from the other folds' held-out shots (cross-fitted). The factor multiplies the
  head's *calibrated* probabilities, so a fold's weight means what the deployed one does. (Stacked raw logits,
  ``a·(Gaussian log-likelihood) + b·(linear logits)`` with a free ``b``, fail there: at one shot per class a held-out
  shot's class has no shot in its fold, the fold's linear logits are weak there, and ``b`` goes to 0 — on the
  queries, where every class has its shot, the best ``b`` was ~90 and the stacked head alone lost up to 2.5 points
  of top-5. Against each fold's calibrated head, the fold's ``a`` is within ~20% of the query-optimal one.)
* it is kept only if its top-1 accuracy on the held-out shots is above the inductive default head's beyond chance
  (the exact sign test on the shots only one of them gets right, one-sided, at the level of "one standard error",
  :data:`ONE_SE_LEVEL`, :func:`sign_test`), and its top-5 accuracy and NLL are not worse by more than
  one standard error of the paired difference (:func:`paired_gate`). Then the default head carries the factor at
  ``a`` fitted on all held-out shots, and the linear head named alone (where it is not the default) its own power,
  fitted the same way against each fold's calibrated linear head and kept only where its own paired check passes;
  the kernel head, where it is not the default, stays the inductive one (the pool does not re-solve it with shots).

**Without labels: does the pool's structure replicate?** The pool is split into two random halves, A
and B, and each is adapted on its own. The head adapted on A predicts B, which it never saw, and is
compared with B's own transductive posterior; so is the inductive head. B's posterior starts from the
inductive prediction and is pulled towards it, so the adapted head from A agrees with it more often
than the inductive head only where both halves found the same class structure — not noise in one half
(few images per class, many classes). Pooled over A→B and B→A, the pool-adapted heads are kept only if
that agreement (argmax) is higher beyond chance (the same sign test) and the adapted head's top 5 holds the
other half's posterior class not less often by more than one standard error (:func:`replication_gate`). The
adapted linear head (the transduction's posterior) is then the default head; with no labels the temperatures are
set so that each adapted head's mean top-1 probability on the pool equals the agreement measured here
(``agreement_pool``, :func:`svgen.transductive.solve.match_confidence`): a head's accuracy on the half it did not
see, judged by that half's own posterior, stands in for the accuracy its confidence should claim.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from svgen.calibration import temperatures as calibration
from svgen.calibration.temperatures import KERNEL_LOG_FLOOR
from svgen.heads import predictor
from svgen.fewshot import adapt as shot_adapt
from svgen.fewshot import residual
from svgen.transductive.decision import Check, Evidence, Gate, HeldOutShots, Reason, Replication, fallback
from svgen.selection import DEFAULT, AdaptConfig, Paired, ahead, behind, config_or_default, paired
from svgen.transductive.pool import Stage, transduce
from svgen.state import TextSide
from svgen.core.roots import newton_minimum
from svgen.core.support import IMAGE, image_rows

log = logging.getLogger(__name__)

def shot_folds(y: np.ndarray, n_classes: int, seed: int = 0) -> list:
    """Folds of shot indices (each a sorted array, together every shot once unless noted). With three or more
    shots in every class that has any: the balanced folds of :func:`svgen.fewshot.residual.balanced_folds`, one
    shot of every class held out at a time (at most :data:`~svgen.fewshot.residual.MAX_FOLDS` folds, so above that
    many shots per class some shots are never held out): each fold's predictor keeps all but one shot per class,
    the nearest to the deployed one (a pool helps a predictor with fewer shots more, so with halves of the
    shots the check promised gains the deployed predictor did not get: ucf101 at 4 shots kept pools that cost 1.6 points).
    Otherwise two folds: half of each class's shots in each (the odd one of a class alternates between folds
    from class to class); classes with one shot alternate whole. Empty folds are dropped (a single shot gives
    one fold)."""
    counts = np.bincount(y, minlength=n_classes)
    if counts[counts > 0].size and counts[counts > 0].min() >= 3:
        return residual.balanced_folds(y, seed)
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(y), dtype=np.int64)
    turn = 0
    for c in range(n_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        for j, i in enumerate(idx):
            fold[i] = (j + turn) % 2
        turn = (turn + len(idx)) % 2
    return [np.flatnonzero(fold == f) for f in (0, 1) if (fold == f).any()]


def paired_gate(p_ind: np.ndarray, p_pool: np.ndarray, y: np.ndarray, level: float = DEFAULT.level) -> Gate:
    """The pool-adapted probabilities ``p_pool`` against the inductive ``p_ind`` on the same held-out labelled images
    ``y`` (:func:`shots_failures` decides)."""
    def per_image(p):
        order = np.argsort(-p, axis=1)[:, :5]
        return ((order[:, 0] == y).astype(float), np.any(order == y[:, None], axis=1).astype(float),
                -np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)))

    (a1, a5, an), (b1, b5, bn) = per_image(p_ind), per_image(p_pool)
    stats = HeldOutShots(paired(b1, a1), paired(b5, a5), paired(bn, an), int((b1 > a1).sum()), int((b1 < a1).sum()))
    return Gate(stats, shots_failures(stats, level), level)


def negated(p: Paired) -> Paired:
    """A paired comparison of costs (NLL) as one of scores (−NLL: larger is better)."""
    return Paired(-p.candidate, -p.baseline, -p.difference, p.standard_error, p.n)


def shots_failures(s: HeldOutShots, level: float) -> tuple:
    """Why the pool fails on held-out shots (none: kept): the inductive predictor must be behind it on top-1
    (:func:`svgen.selection.ahead`), and it must not be behind on top-5 nor on −NLL (:func:`svgen.selection.behind`)."""
    why = []
    if not ahead(s.top1, level):
        why.append(f"top-1 on held-out shots {100 * s.top1.candidate:.1f}% is not above the inductive "
                   f"{100 * s.top1.baseline:.1f}% by more than {level:g} SE ({s.gained} gained, {s.lost} lost)")
    if behind(s.top5, level):
        why.append(f"top-5 {100 * s.top5.candidate:.1f}% is below the inductive {100 * s.top5.baseline:.1f}% by more "
                   f"than {level:g} SE")
    if behind(negated(s.nll), level):
        why.append(f"NLL {s.nll.candidate:.3f} is above the inductive {s.nll.baseline:.3f} by more than {level:g} SE")
    return tuple(why)


def replication_gate(agree_pool: np.ndarray, agree_ind: np.ndarray, agree5_pool: np.ndarray,
                     agree5_ind: np.ndarray, level: float = DEFAULT.level) -> Gate:
    """Per pool image of one half: does the head adapted on the other half agree with this half's own posterior (its
    argmax first: ``agree_pool``; within its top 5: ``agree5_pool``), against the inductive head (``agree_ind``,
    ``agree5_ind``)? (:func:`replication_failures` decides.)"""
    stats = Replication(paired(agree_pool, agree_ind), paired(agree5_pool, agree5_ind),
                        int((agree_pool > agree_ind).sum()), int((agree_pool < agree_ind).sum()))
    return Gate(stats, replication_failures(stats, level), level)


def replication_failures(s: Replication, level: float) -> tuple:
    """Why the halves fail (none: kept): the inductive head must be behind the adapted one on agreement (argmax), and
    the adapted one not behind on top-5 agreement."""
    why = []
    a, a5 = s.agreement, s.top5
    if not ahead(a, level):
        why.append(f"a head adapted on one half of the pool agrees with the other half's own posterior on "
                   f"{100 * a.candidate:.1f}% of it, the inductive head on {100 * a.baseline:.1f}%: the pool's "
                   f"structure does not replicate (not above by more than {level:g} SE)")
    if behind(a5, level):
        why.append(f"the adapted head's top 5 holds the other half's posterior class on {100 * a5.candidate:.2f}% of "
                   f"it, the inductive head's on {100 * a5.baseline:.2f}%, more often by more than {level:g} SE")
    return tuple(why)


NLL_TOL = 1e-9   # nats: a weight whose Newton step would lower the mean NLL by less is the fit (numerical, not a rule)


def fit_pool_weight(g: np.ndarray, z: np.ndarray, y: np.ndarray, tol: float = 1e-7) -> float:
    """The weight ``a ≥ 0`` minimising the mean NLL of ``softmax(a·g + z)`` on labelled rows ``y``: how much of the
    pool's Gaussian log-likelihood ``g`` (N×C) joins the calibrated inductive log-probabilities ``z``
    (:func:`check_with_shots`). Convex in ``a``: slope ``mean(E_p[g] − g_y)``, curvature ``mean(Var_p[g]) ≥ 0``. Zero
    when the slope is ≥ 0 at ``a = 0`` (the pool adds nothing the inductive head does not say); else Newton steps on
    the slope (:func:`svgen.core.roots.newton_minimum`), kept inside the bracket of the root found so far (bisection where a step would leave it, doubling
    until the slope turns), to ``tol`` relative or until a step would lower the mean NLL by less than
    :data:`NLL_TOL` (where held-out rows are nearly separated the NLL is flat far along ``a``, its minimiser moves
    with the last bits of the inputs, and the stopping point on the path from 0 does not)."""
    g = np.asarray(g, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    g = g - g.mean(axis=1, keepdims=True)           # row constants change no softmax; centring keeps a·g small
    gy = g[np.arange(len(y)), y]

    def derivatives(a: float) -> tuple:
        L = a * g + z
        L = L - L.max(axis=1, keepdims=True)
        p = np.exp(L)
        p /= p.sum(axis=1, keepdims=True)
        mean = (p * g).sum(axis=1)
        return float((mean - gy).mean()), float(((p * g * g).sum(axis=1) - mean ** 2).mean())

    # doubling (while no root is bracketed) starts from a·g of unit spread; a slope that stays negative (the Gaussian
    # part alone separates the rows) gives the largest weight tried
    return newton_minimum(derivatives, step=1.0 / (float(g.std()) or 1.0), tol=tol, flat=NLL_TOL)


def factored_probs(logp: np.ndarray, g: np.ndarray, a: float) -> np.ndarray:
    """``softmax(logp + a·g)``: calibrated log-probabilities ``logp`` times the pool's likelihood ``exp(g)`` to the
    power ``a`` (:class:`svgen.state.PoolFactor`), renormalised."""
    L = np.asarray(logp, dtype=np.float64) + a * np.asarray(g, dtype=np.float64)
    return calibration.softmax(torch.as_tensor(L), 1.0).numpy()


def log_probs(p: np.ndarray) -> np.ndarray:
    """``log max(p, 10⁻³⁰)``: a head's probabilities as the log-probabilities the factor multiplies (the floor is
    the mixture's, :func:`svgen.heads.predictor.scores`)."""
    return np.log(np.maximum(np.asarray(p, dtype=np.float64), KERNEL_LOG_FLOOR))


def pool_parts(record: dict, linear, W0: torch.Tensor, b0: torch.Tensor):
    """(W_G, b_G): the Gaussian log-likelihood part of a transduced linear head ``linear``, which is
    ``W_G + β·t·W0`` (:func:`svgen.transductive.pool.transduce`, ``record`` its record), W0 the linear head the solve
    continued (:attr:`svgen.transductive.pool.PoolFit.prior_linear`: the inductive one, or its LDA part)."""
    k = float(record["prior_strength"]) * float(record["linear_prior_temperature"])
    return linear.weight.double() - k * W0.double(), linear.bias.double() - k * b0.double()


def _steps(items, progress: bool, what: str):
    """``items``, under a progress bar when ``progress`` (the check re-adapts twice: minutes at ImageNet scale)."""
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=f"checking the pool ({what})", unit="fold", leave=False)


def check_with_shots(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float],
                     progress: bool = False, config: Optional[AdaptConfig] = None) -> Check:
    """:func:`paired_gate` on held-out shots made pool members (see the module text). The candidate is the inductive
    default head times the pool's Gaussian likelihood to the power ``a`` (:func:`fit_pool_weight` on the other folds'
    held-out shots, against each fold's own default head: cross-fitted), against the inductive default head. The
    linear head's own power is fitted the same way against each fold's calibrated linear head (``powers``)."""
    C, D = side.n_classes, side.prototypes.shape[1]
    X, y = stage.shots.rows.float(), stage.shots.labels.numpy()
    head = stage.default_head
    folds = shot_folds(y, C, side.config.seed)
    if len(folds) < 2:
        return Check(Evidence.SHOTS, head, stopped=Reason.NO_HELD_OUT_SHOTS,
                     why="one shot in all: no held-out shots to check a pool on")
    parts = []
    for held in _steps(folds, progress, "held-out shots"):
        keep = np.setdiff1d(np.arange(len(y)), held)
        shots = image_rows(X[keep], torch.from_numpy(y[keep]), C, D)
        # the predictor as deployed, without the fold; a pool is only checked when every class has shots, so the
        # deployed mixture tilts no class, and nor does the fold's (its held-out classes are the fold's, not the user's)
        fit = shot_adapt.adapt(stage.zero_shot, shots, side, tilt_shotless=False)
        Xh = F.normalize(X[held], dim=-1)
        with torch.no_grad():
            # the fold's inductive predictor as deployed: its own default head (the mixture's weight is refitted too)
            p_ind = predictor.proba(fit.heads, side.prototypes, side.config.kernel, Xh,
                                    fit.record["default_head"]).numpy()
            part = Stage(fit.heads, stage.zero_shot, fit.record, fit.heads.kernel.support_set().part(IMAGE),
                         fit.record["default_head"])
            pool = transduce(part, side, torch.cat([U, Xh]), strength, progress=False, config=config)
            if not pool.decision.kept:
                return Check(Evidence.SHOTS, head, stopped=Reason.FOLD_DID_NOT_ADAPT,
                             why="without a fold of the shots " + fallback(pool.decision))
            WG, bG = pool_parts(pool.record, pool.heads.linear, pool.prior_linear.weight, pool.prior_linear.bias)
            g = predictor.gaussian_log_likelihood(WG, bG, Xh).numpy()
            # the fold's linear head as deployed: its logits at its own calibrated temperature
            z = (predictor.logits(fit.heads, side.prototypes, side.config.kernel, Xh, "linear").double()
                 / float(fit.heads.calibration.temperatures["linear"])).numpy()
        p_lin = calibration.softmax(torch.as_tensor(z), 1.0).numpy()
        parts.append(HeldOut(held, g, {"default": p_ind, "linear": p_lin}, {"default": log_probs(p_ind), "linear": z}))
    level = config_or_default(config).level
    gate, crossed, power = _check_role(parts, y, "default", level)
    powers, named = {head: power}, {}
    if head != "linear":   # the linear head named alone: its own power, kept where its own check passes
        named["linear"], _, power = _check_role(parts, y, "linear", level)
        if named["linear"].passed:
            powers["linear"] = power
    return Check(Evidence.SHOTS, head, gate, powers=powers, cross_fitted=tuple(crossed), named_heads=named)


@dataclass
class HeldOut:
    """One fold's held-out shots (indices ``rows``): the pool's Gaussian log-likelihood ``g`` at them, and for each
    head role (``"default"``, ``"linear"``) the fold's inductive probabilities and calibrated log-probabilities."""

    rows: np.ndarray
    g: np.ndarray
    probs: dict
    logp: dict


def _check_role(parts: list, y: np.ndarray, role: str, level: float) -> tuple:
    """(:func:`paired_gate` of the ``role`` head times the pool's likelihood against that head alone on every fold's
    held-out shots, each fold's power from the other folds' (cross-fitted); those powers; the power fitted on all)."""
    def power(folds):
        return fit_pool_weight(np.concatenate([p.g for p in folds]), np.concatenate([p.logp[role] for p in folds]),
                               np.concatenate([y[p.rows] for p in folds]))

    crossed = [power([p for j, p in enumerate(parts) if j != f]) for f in range(len(parts))]
    gate = paired_gate(np.concatenate([p.probs[role] for p in parts]),
                       np.concatenate([factored_probs(p.logp[role], p.g, a) for p, a in zip(parts, crossed)]),
                       y[np.concatenate([p.rows for p in parts])], level)
    return gate, crossed, power(parts)


def check_without_shots(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float],
                        progress: bool = False, config: Optional[AdaptConfig] = None) -> Check:
    """:func:`replication_gate` over two random halves of the pool (see the module text): the adapted linear
    head (what a pool deploys) against the inductive default head."""
    N = U.shape[0]
    P, kind = side.prototypes, side.config.kernel
    perm = torch.from_numpy(np.random.default_rng(side.config.seed).permutation(N))
    halves = [perm[: N // 2].sort().values, perm[N // 2:].sort().values]
    head = stage.default_head
    with torch.no_grad():
        ind = top5(predictor.scores(stage.heads, P, kind, U, head))
        adapted = []
        for rows in _steps(halves, progress, "halves of the pool"):
            fit = transduce(stage, side, U[rows], strength, progress=False, config=config)
            if not fit.decision.kept:
                return Check(Evidence.HALVES, head, stopped=Reason.HALF_DID_NOT_ADAPT,
                             why=f"half of the pool alone does not adapt ({fit.decision.why})")
            adapted.append(fit)
        a1, i1, a5, i5 = [], [], [], []
        for a, b in ((0, 1), (1, 0)):
            posterior = adapted[b].labels.argmax(dim=1)[:, None]
            rows = halves[b]
            new = top5(predictor.scores(adapted[a].heads, P, kind, U[rows], "linear"))
            a1.append((new[:, :1] == posterior).any(dim=1).numpy())
            i1.append((ind[rows, :1] == posterior).any(dim=1).numpy())
            a5.append((new == posterior).any(dim=1).numpy())
            i5.append((ind[rows] == posterior).any(dim=1).numpy())
    return Check(Evidence.HALVES, head, replication_gate(*(np.concatenate(v) for v in (a1, i1, a5, i5)),
                                                        level=config_or_default(config).level))


def top5(scores: torch.Tensor) -> torch.Tensor:
    return scores.topk(min(5, scores.shape[1]), dim=1).indices
