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

* the candidate is a *stacked linear head*, ``a·(x̂ W_Gᵀ + b_G) + b·(x̂ W0ᵀ + b0)``: the pool's Gaussian
  log-likelihood (the class model the transduction solved) and the inductive linear head, with (a, b) ≥ 0
  minimising the NLL of held-out shots (:func:`fit_stack`; convex; a = 0 is the inductive linear head alone).
  For the check, each fold's (a, b) comes from the other folds' held-out shots (cross-fitted). Where the
  linear head is zero-shot logits + α·s·LDA logits (:mod:`svgen.fewshot.linear`), a fold's part is that mix
  at the deployed head's α (the fold's own LDA part and its own scale s), not the fold's own choice of α: the
  weights fitted on the folds must mean the same on the deployed head. (With the fold's own α, fgvc at 4
  shots kept pools worth +1.25 query NLL; with the zero-shot logits and the LDA part as separate parts,
  weighed apart, the folds' weaker LDA part gave the zero-shot logits 100× its weight: stanford_cars at 4
  shots kept pools that cost 1 point, and at one shot per class, where every held-out shot's class has no
  shot left, pools that cost up to 7.6.)
* it is kept only if its top-1 accuracy on the held-out shots is above the inductive default head's by
  more than one standard error of the paired difference, and its top-5 accuracy and NLL are not worse by
  more than one (:func:`paired_gate`). Then it is the deployed (default) head, at T = 1, with (a, b) fitted
  on all held-out shots; the kernel head stays the inductive one (with shots the pool does not re-solve it).

**Without labels: does the pool's structure replicate?** The pool is split into two random halves, A
and B, and each is adapted on its own. The head adapted on A predicts B, which it never saw, and is
compared with B's own transductive posterior; so is the inductive head. B's posterior starts from the
inductive prediction and is pulled towards it, so the adapted head from A agrees with it more often
than the inductive head only where both halves found the same class structure — not noise in one half
(few images per class, many classes). Pooled over A→B and B→A, the pool-adapted heads are kept only if
that agreement (argmax) is higher by more than one standard error and the adapted head's top 5 holds the
other half's posterior class not less often by more than one (:func:`replication_gate`). The adapted
linear head (the transduction's posterior) is then the default head; with no labels the temperatures are
set so that each adapted head's mean entropy on the pool equals the inductive head's
(:func:`svgen.transductive.solve.match_entropy`): the adaptation may move the ranking, not claim more certainty.
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from svgen.calibration import mixture
from svgen.calibration import temperatures as calibration
from svgen.heads import predictor
from svgen.heads.scoring import cosine_logits
from svgen.fewshot import adapt as shot_adapt
from svgen.fewshot import residual
from svgen.transductive.pool import Stage, transduce
from svgen.state import TextSide
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


def _se(d: np.ndarray) -> float:
    return float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("inf")


def paired_gate(p_ind: np.ndarray, p_pool: np.ndarray, y: np.ndarray) -> dict:
    """The pool-adapted probabilities ``p_pool`` against the inductive ``p_ind`` on the same held-out
    labelled images ``y``: kept only if top-1 is higher by more than one paired standard error and neither
    top-5 nor NLL is worse by more than one."""
    def per_image(p):
        order = np.argsort(-p, axis=1)[:, :5]
        return ((order[:, 0] == y).astype(float), np.any(order == y[:, None], axis=1).astype(float),
                -np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)))

    (a1, a5, an), (b1, b5, bn) = per_image(p_ind), per_image(p_pool)
    d1, d5, dn = b1 - a1, b5 - a5, bn - an
    out = {"images": int(len(y)), "top1": {"inductive": float(a1.mean()), "pool": float(b1.mean()),
                                             "difference": float(d1.mean()), "standard_error": _se(d1)},
           "top5": {"inductive": float(a5.mean()), "pool": float(b5.mean()),
                    "difference": float(d5.mean()), "standard_error": _se(d5)},
           "nll": {"inductive": float(an.mean()), "pool": float(bn.mean()),
                   "difference": float(dn.mean()), "standard_error": _se(dn)}}
    why = []
    if not d1.mean() > _se(d1):
        why.append(f"top-1 on held-out shots {100 * b1.mean():.1f}% is not above the inductive {100 * a1.mean():.1f}% "
                   "by more than 1 SE")
    if d5.mean() < -_se(d5):
        why.append(f"top-5 {100 * b5.mean():.1f}% is below the inductive {100 * a5.mean():.1f}% by more than 1 SE")
    if dn.mean() > _se(dn):
        why.append(f"NLL {bn.mean():.3f} is above the inductive {an.mean():.3f} by more than 1 SE")
    out.update({"adopt": not why, "reason": "; ".join(why) or None,
                "rule": "kept if top-1 on the held-out shots (unlabelled pool members) is above the inductive "
                        "predictor's by more than 1 SE, and top-5 and NLL are not worse by more than 1 SE (paired)"})
    return out


def replication_gate(agree_pool: np.ndarray, agree_ind: np.ndarray, agree5_pool: np.ndarray,
                     agree5_ind: np.ndarray) -> dict:
    """Per pool image of one half: does the head adapted on the other half agree with this half's own
    posterior (its argmax first: ``agree_pool``; within its top 5: ``agree5_pool``), against the inductive
    head (``agree_ind``, ``agree5_ind``)? Kept only if the adapted head's argmax agrees more often by more
    than one paired standard error and its top 5 is not behind by more than one."""
    d = agree_pool.astype(float) - agree_ind.astype(float)
    d5 = agree5_pool.astype(float) - agree5_ind.astype(float)
    why = []
    if not d.mean() > _se(d):
        why.append(f"a head adapted on one half of the pool agrees with the other half's own posterior on "
                   f"{100 * agree_pool.mean():.1f}% of it, the inductive head on {100 * agree_ind.mean():.1f}%: "
                   "the pool's structure does not replicate by more than 1 SE")
    if d5.mean() < -_se(d5):
        why.append(f"the adapted head's top 5 holds the other half's posterior class on {100 * agree5_pool.mean():.2f}%"
                   f" of it, the inductive head's on {100 * agree5_ind.mean():.2f}%, more often by more than 1 SE")
    return {"images": int(len(d)), "agreement_pool": float(agree_pool.mean()),
            "agreement_inductive": float(agree_ind.mean()), "difference": float(d.mean()), "standard_error": _se(d),
            "top5_agreement_pool": float(agree5_pool.mean()), "top5_agreement_inductive": float(agree5_ind.mean()),
            "adopt": not why, "reason": "; ".join(why) or None,
            "rule": "kept if a head adapted on one half of the pool agrees with the other half's transductive "
                    "posterior (argmax) more often than the inductive head by more than 1 SE, and its top 5 holds "
                    "that class not less often by more than 1 SE (paired, both directions)"}


def fit_stack(parts, y: np.ndarray) -> tuple:
    """Weights ``w ≥ 0`` minimising the mean NLL of ``softmax(Σ_k w_k·parts[k])`` on labelled rows: how much of each
    N×C logit matrix the deployed head takes (:func:`check_with_shots`: the pool's Gaussian log-likelihood and the
    inductive linear head's logits). Convex in ``w`` (a softmax of a linear function of it); the start is the
    second part alone (the inductive head)."""
    from scipy.optimize import minimize

    feats = [np.asarray(f, dtype=np.float64) for f in parts]
    scales = [float(f.std()) or 1.0 for f in feats]          # conditioning: unit-scale features
    feats = [f / sc for f, sc in zip(feats, scales)]
    rows = np.arange(len(y))

    def nll(theta):
        L = sum(t * f for t, f in zip(theta, feats))
        L = L - L.max(axis=1, keepdims=True)
        lse = np.log(np.exp(L).sum(axis=1))
        p = np.exp(L - lse[:, None])
        grad = [float(((p * f).sum(axis=1) - f[rows, y]).mean()) for f in feats]
        return float((lse - L[rows, y]).mean()), np.array(grad)

    x0 = np.zeros(len(feats))
    x0[min(1, len(feats) - 1)] = 1.0
    res = minimize(nll, x0=x0, jac=True, method="L-BFGS-B", bounds=[(0.0, None)] * len(feats))
    return tuple(float(t / sc) for t, sc in zip(res.x, scales))


def stacked_probs(parts, weights) -> np.ndarray:
    """``softmax(Σ_k w_k·parts[k])``: the stacked head's probabilities (its T is 1)."""
    L = sum(w * np.asarray(f, dtype=np.float64) for w, f in zip(weights, parts))
    return calibration.softmax(torch.as_tensor(L), 1.0).numpy()


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
                     progress: bool = False) -> dict:
    """:func:`paired_gate` on held-out shots made pool members (see the module text). The candidate is the
    stacked linear head ``a·(pool Gaussian log-likelihood) + b·(inductive linear logits)``, (a, b) by
    :func:`fit_stack` on the other folds' held-out shots (cross-fitted), against the inductive default head. A
    fold's linear logits are the deployed head's mix (its α) of the fold's zero-shot and LDA logits."""
    C, D = side.n_classes, side.prototypes.shape[1]
    X, y = stage.shots.rows.float(), stage.shots.labels.numpy()
    head = stage.default_head
    folds = shot_folds(y, C, side.config.seed)
    base = {"evidence": "held-out shots as pool members", "head": head}
    if len(folds) < 2:
        return {**base, "adopt": False, "reason": "one shot in all: no held-out shots to check a pool on"}
    alpha = (stage.fewshot.get("linear") or {}).get("alpha")   # None: the linear head is the LDA head
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
            p_kernel = predictor.proba(fit.heads, side.prototypes, side.config.kernel, Xh, "kernel").numpy()
            part = Stage(fit.heads, stage.zero_shot, fit.record, fit.heads.kernel.support_set().part(IMAGE),
                         fit.record["default_head"])
            pool = transduce(part, side, torch.cat([U, Xh]), strength, progress=False)
            if pool.record.get("fallback"):
                return {**base, "adopt": False, "reason": "without a fold of the shots " + pool.record["fallback"]}
            W0, b0 = pool.prior_linear.weight, pool.prior_linear.bias   # the LDA head (part) the solve continued
            WG, bG = pool_parts(pool.record, pool.heads.linear, W0, b0)
            g = (Xh.double() @ WG.T + bG).numpy()
            z = (Xh.double() @ W0.double().T + b0.double()).numpy()
            if alpha is not None:   # the deployed linear head's mix: zero-shot logits + α·s·LDA logits
                z = (cosine_logits(Xh.double(), side.prototypes.double()).numpy()
                     + alpha * float(fit.record["linear"]["scale"]) * z)
        parts.append((held, p_ind, (g, z), p_kernel))
    # cross-fitted: each fold's weights (the stack's, then the mixture's) from the other folds' held-out shots
    fitted = [stack_and_mixture([p for j, p in enumerate(parts) if j != f], y) for f in range(len(parts))]
    p_pool = np.concatenate([mixed_probs(part, *fitted[f]) for f, part in enumerate(parts)])
    rows = np.concatenate([p[0] for p in parts])
    gate = paired_gate(np.concatenate([p[1] for p in parts]), p_pool, y[rows])
    (a, b), w = stack_and_mixture(parts, y)
    gate.update({**base, "stack": {"gaussian": a, "inductive_linear": b, "cross_fitted": [st for st, _ in fitted]},
                 "mixture_weight": w, "cross_fitted_mixture_weights": [m for _, m in fitted]})
    return gate


def stack_and_mixture(parts: list, y: np.ndarray) -> tuple:
    """((a, b), w) from folds' held-out shots ``parts`` (rows, inductive probabilities, (Gaussian, linear) logits,
    kernel probabilities): the stacked linear head's weights (:func:`fit_stack`), then the weight of the inductive
    kernel head in the mixture with it (:func:`svgen.calibration.mixture.fit_weight`), both by held-out NLL: the
    pool adapts the linear head, and the deployed predictor mixes it with the kernel head as the shots' fit does."""
    yy = np.concatenate([y[p[0]] for p in parts])
    feats = [np.concatenate([p[2][k] for p in parts]) for k in range(2)]
    st = fit_stack(feats, yy)
    w = mixture.fit_weight(np.concatenate([p[3] for p in parts]), stacked_probs(feats, st), yy)["weight"]
    return st, w


def mixed_probs(part, stack: tuple, w: float) -> np.ndarray:
    """``w·p_kernel + (1 − w)·softmax(stacked logits)`` on one fold's held-out shots."""
    return mixture.mix(w, part[3], stacked_probs(part[2], stack))


def check_without_shots(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float],
                        progress: bool = False) -> dict:
    """:func:`replication_gate` over two random halves of the pool (see the module text): the adapted linear
    head (what a pool deploys) against the inductive default head."""
    N = U.shape[0]
    P, kind = side.prototypes, side.config.kernel
    perm = torch.from_numpy(np.random.default_rng(side.config.seed).permutation(N))
    halves = [perm[: N // 2].sort().values, perm[N // 2:].sort().values]
    head = stage.default_head
    base = {"evidence": "halves of the pool", "head": head}
    with torch.no_grad():
        ind = top5(predictor.scores(stage.heads, P, kind, U, head))
        adapted = []
        for rows in _steps(halves, progress, "halves of the pool"):
            fit = transduce(stage, side, U[rows], strength, progress=False, kernel_head=False)
            if fit.record.get("fallback"):
                return {**base, "adopt": False, "reason": "half of the pool alone does not adapt ("
                        + fit.record["fallback"].replace("; kept the inductive heads", "") + ")"}
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
    gate = replication_gate(*(np.concatenate(v) for v in (a1, i1, a5, i5)))
    gate.update(base)
    return gate


def top5(scores: torch.Tensor) -> torch.Tensor:
    return scores.topk(min(5, scores.shape[1]), dim=1).indices
