"""Whether a pool may change the heads: held-out shots or halves of the pool (docs/transductive.md, "The rule")."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from svgen.core.logits import KERNEL_LOG_FLOOR
from svgen.core.roots import newton_minimum
from svgen.core.support import IMAGE, image_rows
from svgen.adapt import shots as shot_adapt
from svgen import records
from svgen.adapt.config import AdaptConfig
from svgen.adapt.heldout import balanced_folds
from svgen.adapt.select import Score, ahead, behind, choose, paired
from svgen.adapt.transduce import Scored, Stage, score, transduce
from svgen.heads import calibration, predictor
from svgen.state import Check, Evidence, Gate, Reason, TextSide
from svgen.steps import bar

NLL_TOL = 1e-9   # nats: a Newton step lowering the mean NLL by less ends the power's fit (numerical)
TOP1, TOP5, NLL = Score.TOP1, Score.TOP5, Score.NLL


def shot_folds(y: np.ndarray, n_classes: int, seed: int, max_folds: int) -> list:
    """With ≥ 3 shots in every class with any, :func:`svgen.adapt.heldout.balanced_folds`; else two folds of half each."""
    counts = np.bincount(y, minlength=n_classes)
    if counts[counts > 0].size and counts[counts > 0].min() >= 3:
        return balanced_folds(y, seed, max_folds)
    rng = np.random.default_rng(seed)   # every other shot, class after class: odd counts and one-shot classes alternate
    order = np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in range(n_classes)])
    return [np.sort(order[f::2]) for f in (0, 1) if order[f::2].size]


def paired_gate(p_ind: np.ndarray, p_pool: np.ndarray, y: np.ndarray, level: float) -> Gate:
    """Pool-adapted against inductive probabilities on the same held-out labelled images ``y``: :func:`decided` on
    their per-image scores (:class:`~svgen.adapt.select.Score`)."""
    return decided({s: s.per_image(p_pool, y) for s in (TOP1, TOP5, NLL)},
                   {s: s.per_image(p_ind, y) for s in (TOP1, TOP5, NLL)}, level)


def decided(pool: dict, ind: dict, level: float) -> Gate:
    """The pool against the inductive predictor on per-image scores ({Score: larger is better}) by ``CHOICES["pool"]``
    (without NLL, the halves' agreement: ``"pool_halves"``); the paired means, where refused the failures in words."""
    choice = choose({"inductive": ind, "pool": pool}, None, "pool" if NLL in pool else "pool_halves", level)
    g = Gate(paired(pool[TOP1], ind[TOP1]), paired(pool[TOP5], ind[TOP5]), level,
             paired(-pool[NLL], -ind[NLL]) if NLL in pool else None,
             int((pool[TOP1] > ind[TOP1]).sum()), int((pool[TOP1] < ind[TOP1]).sum()))
    return replace(g, failed=() if choice.adapted else judged(g).failed or (choice.why,))


def judged(g: Gate) -> Gate:
    """``g`` with its failures in words (:func:`svgen.records.gate_failures`)."""
    return replace(g, failed=records.gate_failures(g, not ahead(g.top1, g.level), behind(g.top5, g.level),
                                                   g.nll is not None and ahead(g.nll, g.level)))


def fit_pool_weight(g: np.ndarray, z: np.ndarray, y: np.ndarray, tol: float = 1e-7) -> float:
    """``a ≥ 0`` minimising the mean NLL of ``softmax(a·g + z)`` on rows ``y`` (convex; Newton on the slope)."""
    z, g = np.asarray(z, dtype=np.float64), np.asarray(g, dtype=np.float64)
    g = g - g.mean(axis=1, keepdims=True)
    gy = g[np.arange(len(y)), y]

    def derivatives(a: float) -> tuple:
        L = a * g + z
        p = np.exp(L - L.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        mean = (p * g).sum(axis=1)
        return float((mean - gy).mean()), float(((p * g * g).sum(axis=1) - mean ** 2).mean())

    return newton_minimum(derivatives, step=1.0 / (float(g.std()) or 1.0), tol=tol, flat=NLL_TOL)


def factored_probs(logp: np.ndarray, g: np.ndarray, a) -> np.ndarray:
    """``softmax(logp + a·g)``: calibrated log-probabilities times the pool's likelihood to the power ``a``."""
    L = np.asarray(logp, dtype=np.float64) + a * np.asarray(g, dtype=np.float64)
    return calibration.softmax(torch.as_tensor(L), 1.0).numpy()


def _fold(stage: Stage, side: TextSide, U: torch.Tensor, held: np.ndarray, strength: Optional[float],
          config: AdaptConfig):
    """The predictor refitted without the ``held`` shots, which join the pool unlabelled: (held rows, the pool's
    log-likelihood g there, its default head's p and log p, its calibrated linear head's p and logits), or the
    refusal of a fold that did not adapt."""
    C, P, kind = side.n_classes, side.prototypes, side.config.kernel
    X, y = stage.shots.rows.float(), stage.shots.labels.numpy()
    keep = np.setdiff1d(np.arange(len(y)), held)
    shots = image_rows(X[keep], torch.from_numpy(y[keep]), C, P.shape[1])
    fit = shot_adapt.adapt(stage.zero_shot, shots, side, tilt_shotless=False, config=config)   # every class has shots
    Xh, UX = F.normalize(X[held], dim=-1), torch.cat([U, F.normalize(X[held], dim=-1)])
    part = Stage(fit.heads, stage.zero_shot, fit.heads.kernel.support_set().part(IMAGE), fit.default_head, fit.lda)
    with torch.no_grad():
        p_ind = predictor.proba(fit.heads, P, kind, Xh, fit.default_head).numpy()   # float64
        pool = transduce(part, side, UX, score(part, side, UX), config, strength)
        if not pool.decision.kept:
            return pool.decision
        g = predictor.gaussian_log_likelihood(pool.gaussian.weight, pool.gaussian.bias, Xh).numpy()
        z = (predictor.logits(fit.heads, P, kind, Xh, "linear").double()
             / float(fit.heads.calibration.temperatures["linear"])).numpy()
    return held, g, p_ind, np.log(np.maximum(p_ind, KERNEL_LOG_FLOOR)), calibration.softmax(torch.as_tensor(z), 1.0).numpy(), z


def check_with_shots(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float], config: AdaptConfig,
                     progress: bool = False) -> Check:
    """Each fold's held-out shots unlabelled in the pool: the default and linear heads × its likelihood^a, or alone."""
    y, head = stage.shots.labels.numpy(), stage.default_head
    folds = shot_folds(y, side.n_classes, side.config.seed, max_folds=config.max_folds)
    if len(folds) < 2:
        return Check(Evidence.SHOTS, head, stopped=Reason.NO_HELD_OUT_SHOTS,
                     why="one shot in all: no held-out shots to check a pool on")
    parts = []
    for held in bar(folds, progress, desc="checking the pool (held-out shots)", unit="fold", leave=False):
        part = _fold(stage, side, U, held, strength, config)
        if not isinstance(part, tuple):
            return Check(Evidence.SHOTS, head, stopped=Reason.FOLD_DID_NOT_ADAPT,
                         why="without a fold of the shots " + records.fallback(part))
        parts.append(part)
    rows, g, *roles = map(np.concatenate, zip(*parts))
    fold, yh = np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts]), y[rows]

    def check(p: np.ndarray, logp: np.ndarray) -> tuple:   # the gate, each fold's power from the others, on all
        crossed = [fit_pool_weight(g[fold != f], logp[fold != f], yh[fold != f]) for f in range(len(parts))]
        gate = paired_gate(p, factored_probs(logp, g, np.asarray(crossed)[fold, None]), yh, config.level)
        return gate, crossed, fit_pool_weight(g, logp, yh)

    gate, crossed, power = check(*roles[:2])
    powers, named = {head: power}, {}
    if head != "linear":
        named["linear"], _, power = check(*roles[2:])
        if named["linear"].passed:
            powers["linear"] = power
    return Check(Evidence.SHOTS, head, gate, powers=powers, cross_fitted=tuple(crossed), named_heads=named)


def check_without_shots(stage: Stage, side: TextSide, U: torch.Tensor, scored: Scored, strength: Optional[float],
                        config: AdaptConfig, progress: bool = False) -> Check:
    """Two random halves adapted alone: the linear head of each against the inductive default head on the other."""
    N, P, kind, k = U.shape[0], side.prototypes, side.config.kernel, min(5, side.n_classes)
    perm = torch.from_numpy(np.random.default_rng(side.config.seed).permutation(N))
    halves, adapted = [perm[: N // 2].sort().values, perm[N // 2:].sort().values], []
    with torch.no_grad():
        for rows in bar(halves, progress, desc="checking the pool (halves of the pool)", unit="fold", leave=False):
            fit = transduce(stage, side, U[rows], scored.rows(rows), config, strength)
            if not fit.decision.kept:
                return Check(Evidence.HALVES, stage.default_head, stopped=Reason.HALF_DID_NOT_ADAPT,
                             why=f"half of the pool alone does not adapt ({fit.decision.why})")
            adapted.append(fit)
        ind, hits = scored.scores.topk(k, dim=1).indices, []   # per image of a half: does its posterior class lie in
        for a, b in ((0, 1), (1, 0)):                            # the adapted and the inductive head's top 1, then 5
            posterior, rows = adapted[b].labels.argmax(dim=1)[:, None], halves[b]
            new = predictor.scores(adapted[a].heads, P, kind, U[rows], "linear").topk(k, dim=1).indices
            hits.append([(t == posterior).any(dim=1).numpy() for t in (new[:, :1], ind[rows, :1], new, ind[rows])])
    pool1, ind1, pool5, ind5 = map(np.concatenate, zip(*hits))
    gate = decided({TOP1: pool1, TOP5: pool5}, {TOP1: ind1, TOP5: ind5}, config.level)
    return Check(Evidence.HALVES, stage.default_head, gate)
