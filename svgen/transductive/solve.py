"""Unlabelled images as support vectors: transductive zero-shot and few-shot in closed form.

The pool ``U`` (N unit rows, no labels) is pseudo-labelled by the current (inductive) heads and
the class model is re-solved in closed form, repeatedly, with the inductive prediction kept as a
prior so it cannot drift away (the KL term of TransCLIP, Zanella et al., NeurIPS 2024). One
round, for soft labels ``Z`` (N×C, rows on the simplex):

    μ_c   = (Σ_i z_ic û_i + Σ_{shots of c} x̂ + κ·m_c) / (Σ_i z_ic + n_c + κ)       class means
    v     = (Σ_i Σ_c z_ic (û_i − μ_c)² + Σ_shots (x̂ − μ_y)²) / (N + n)           one shared diagonal variance
    ℓ_ic  = û_i·(μ_c/v) − ½ Σ_d μ_cd²/v_d                                        Gaussian log-likelihood (+ const_i)
    Z     ← softmax((β·log p⁰ + ℓ + Σ_{j ∈ kNN(i)} w_ij z_j) / T_post)           a few fixed-point steps

``log p⁰`` is the inductive head's log-probability (its scores at a temperature chosen without
labels, :func:`match_entropy`), β the prior strength, ``m_c`` the prior means (the prototypes moved
onto the pool's centre, :func:`svgen.fewshot.lda.prior_means`) with κ = 1 pseudo-image per class, and
``w_ij = max(0, û_i·û_j)`` over the k = 3 nearest pool neighbours (sparse: N×k, never N×N). Each
step is the minimiser of ``Σ_i KL(z_i || p⁰_i^β e^{ℓ_i + Σ_j w_ij z_j})`` over ``z_i`` — the
block-coordinate update TransCLIP derives (at ``T_post`` = 1). Shots (labelled images) keep their labels
fixed. ``T_post`` (:func:`transduce`'s ``temperature``) is 1 unless the class model's scale was fitted on
labels: with shots that carry a within-class scatter the Gaussian is the inductive LDA head's, whose logits
the shots' leave-one-out NLL puts at a temperature of about 5–20 (a 512-d likelihood at its own scale is
far sharper than the truth), and dividing by that temperature makes ``Z`` the calibrated posterior, so each
pool image weighs on the class means with the probability the model can vouch for, not as a hard label
(the first round starts from the prior at the same temperature, ``softmax(log p⁰ / T_post)``).

The solved model is a linear head: ``x̂ ↦ x̂ Wᵀ + b`` with ``W = μ/v``, ``b = −½ Σ_d μ²/v`` (the
log-likelihood, up to a per-row constant); :func:`gmm_head`.

Safety:

* fall-back: a pool with fewer images than classes carries no per-class information; the heads are
  left as they were and ``transductive.fallback`` says why (:data:`MIN_POOL_PER_CLASS`).
* the prior strength starts at β₀ (:func:`prior_strength`: from the pool size per class and the
  number of shots) and is raised (× :data:`ESCALATE`) while the rounds do not settle — when after
  :data:`ROUNDS` rounds the argmax labels of the last two still disagree on more than
  1 − :data:`STABLE` of the pool, the pool's clusters are not locking onto the classes and the
  prior must hold them. After :data:`MAX_ESCALATIONS` raises without settling, the inductive heads
  are kept (:func:`settle`). Every try is recorded.

Zero-shot, the kept pool's kernel head is this posterior with the kernel vote as its prior, on new images (without
the neighbour term): :func:`svgen.transductive.adapt._adopt_posterior`; the vote itself is not re-solved.

Memory: ``N×C`` float32 matrices (a few at a time) and an ``N×k`` neighbour list; the k-NN search
runs in row blocks of ``U Uᵀ``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from svgen.core.roots import bisect
from svgen.errors import SvgenError
from svgen.selection import AdaptConfig, config_or_default
from svgen.selection import Decision
from svgen.transductive.decision import Reason, refuse

log = logging.getLogger(__name__)

KNN_BLOCK = 2048


@dataclass
class Transduction:
    """The outcome of :func:`transduce` (``labels`` on the pool; the class model as a linear head)."""

    labels: torch.Tensor              # N×C soft labels (rows sum to 1)
    weight: torch.Tensor              # C×D linear head W = μ/v
    bias: torch.Tensor                # C
    info: dict = field(default_factory=dict)
    logits: Optional[torch.Tensor] = None   # N×C: labels = softmax(logits) (the last fixed-point step's argument)


def prior_strength(n_pool: int, n_classes: int, n_shots: int = 0) -> float:
    """The starting KL weight β₀ of the inductive prior, from the pool size per class.

    A prior calibrated by :func:`match_entropy` (zero-shot, or one shot per class): ``1 + C/N`` —
    TransCLIP's weight 1, larger for thinner pools. A prior that is a Gaussian model fitted on
    ``n_shots`` labelled images (the LDA head with a within-class covariance): ``n_shots/N``
    (shots per class over pool images per class), so it counts as much as the labelled evidence
    it was fitted on.
    """
    if n_shots:
        return n_shots / max(n_pool, 1)
    return 1.0 + n_classes / max(n_pool, 1)


def too_small(n_pool: int, n_classes: int, config: Optional[AdaptConfig] = None) -> Optional[Decision]:
    """The refusal of a pool too small to use (None: use it)."""
    if n_pool < config_or_default(config).min_pool_per_class * n_classes:
        return refuse(Reason.POOL_TOO_SMALL,
                      f"pool of {n_pool} unlabelled images is smaller than the {n_classes} classes")
    return None


def _entropy(logits: torch.Tensor) -> float:
    lp = torch.log_softmax(logits, dim=1)
    return float(-(lp.exp() * lp).sum(dim=1).mean())


CALIBRATION_ROWS = 2048      # match_entropy looks at this many evenly spaced pool rows at most


def calibration_rows(n: int) -> torch.Tensor:
    """Evenly spaced row indices (at most :data:`CALIBRATION_ROWS`) for the entropy calibration."""
    return torch.linspace(0, n - 1, min(n, CALIBRATION_ROWS)).round().long()


def match_entropy(scores: torch.Tensor, target: float, iters: int = 40) -> float:
    """The scale t for which ``softmax(t·scores)`` has mean entropy ``target`` (bisection on log t).

    How a head's scores are turned into probabilities without labels: the target is the mean
    entropy of CLIP's own calibrated ``softmax(100·cos)`` on the same images. Large pools are
    calibrated on :func:`calibration_rows`.
    """
    s = scores[calibration_rows(scores.shape[0])].float()
    s = s - s.mean(dim=1, keepdim=True)
    spread = float(s.abs().max())
    if spread == 0 or not math.isfinite(spread):
        return 1.0
    lo, hi = math.log(1e-3 / spread), math.log(1e4 / spread)
    if _entropy(s * math.exp(hi)) > target:
        return math.exp(hi)
    return math.exp(bisect(lambda m: _entropy(s * math.exp(m)) > target, lo, hi, iters))


def match_confidence(scores: torch.Tensor, target: float, iters: int = 40) -> float:
    """The scale t for which ``softmax(t·scores)`` has mean top-1 probability ``target`` on the pool (bisection on
    log t; each row's top-1 probability grows with t, so the mean does). ``target`` is clipped into
    ``(1/C, 1)``; large pools are calibrated on :func:`calibration_rows`."""
    s = scores[calibration_rows(scores.shape[0])].double()
    s = s - s.mean(dim=1, keepdim=True)
    spread = float(s.abs().max())
    if spread == 0 or not math.isfinite(spread):
        return 1.0
    C = s.shape[1]
    target = min(max(float(target), 1.0 / C + 1e-6), 1.0 - 1e-6)

    def confidence(m: float) -> float:
        return float(torch.softmax(s * math.exp(m), dim=1).max(dim=1).values.mean())

    lo, hi = math.log(1e-3 / spread), math.log(1e4 / spread)
    if confidence(hi) < target:
        return math.exp(hi)
    return math.exp(bisect(lambda m: confidence(m) < target, lo, hi, iters))


def knn_graph(U: torch.Tensor, k: int, block: int = KNN_BLOCK):
    """(idx N×k, w N×k): each row's k nearest other rows by cosine and ``max(0, cos)`` weights.

    Row blocks of ``U Uᵀ``: memory ``block × N``, never N×N.
    """
    N = U.shape[0]
    k = min(k, N - 1)
    idx = torch.empty(N, k, dtype=torch.int64)
    w = torch.empty(N, k, dtype=U.dtype)
    for s in range(0, N, block):
        S = U[s:s + block] @ U.T
        r = torch.arange(S.shape[0])
        S[r, s + r] = -float("inf")
        v, i = S.topk(k, dim=1)
        idx[s:s + block], w[s:s + block] = i, v.clamp_min(0)
    return idx, w


def _propagate(Z: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(Z)
    for j in range(idx.shape[1]):
        out.addcmul_(w[:, j:j + 1], Z[idx[:, j]])
    return out


def gmm_head(mu: torch.Tensor, var: torch.Tensor, precision: Optional[torch.Tensor] = None):
    """(W, b) with ``x̂ Wᵀ + b`` = the Gaussian log-likelihood of each class up to a per-row constant
    (shared diagonal variance ``var``, or a fixed shared ``precision`` matrix Σ⁻¹ when given)."""
    W = mu / var if precision is None else mu @ precision
    return W, -0.5 * (mu * W).sum(dim=1)


def class_model(U, Z, shots_x, shots_y, means, kappa: float):
    """(μ C×D, v D): soft class means with κ prior pseudo-images, one shared diagonal variance."""
    C, D = means.shape
    zs = Z.sum(dim=0)
    ZU = Z.T @ U
    SX = torch.zeros(C, D, dtype=U.dtype)
    nX = torch.zeros(C, dtype=U.dtype)
    if shots_x is not None and len(shots_x):
        SX.index_add_(0, shots_y, shots_x)
        nX = torch.bincount(shots_y, minlength=C).to(U.dtype)
    mu = (ZU + SX + kappa * means) / (zs + nX + kappa)[:, None]
    # Σ_i Σ_c z_ic (u_i − μ_c)² per dimension, with Σ_c z_ic = 1
    var = (U * U).sum(dim=0) - 2 * (mu * ZU).sum(dim=0) + (zs[:, None] * mu * mu).sum(dim=0)
    n = U.shape[0]
    if shots_x is not None and len(shots_x):
        var = var + ((shots_x - mu[shots_y]) ** 2).sum(dim=0)
        n += shots_x.shape[0]
    var = var / n
    floor = 1e-3 * float(var.clamp_min(0).mean()) + 1e-12
    return mu, var.clamp_min(floor)


def transduce(U: torch.Tensor, prior_logits: torch.Tensor, means: torch.Tensor, shots_x=None, shots_y=None,
              strength: Optional[float] = None, precision: Optional[torch.Tensor] = None,
              graph=None, progress: bool = False, temperature: float = 1.0,
              config: Optional[AdaptConfig] = None) -> Transduction:
    """Pseudo-label the pool and re-solve the class model in closed form, ``rounds`` times.

    ``U`` N×D unit rows; ``prior_logits`` N×C (the inductive head's calibrated logits; only their
    log-softmax matters); ``means`` C×D prior means. ``strength`` β defaults to
    :func:`prior_strength`. ``precision`` (D×D) fixes the shared covariance (with shots: the
    inductive LDA head's shrunk within-class covariance, estimated on labels) instead of
    re-estimating a diagonal one from the soft labels. ``graph`` is a precomputed
    :func:`knn_graph` (idx, w) of ``U``. ``temperature`` T_post divides each fixed-point step's argument
    (1: TransCLIP's update; with shots, the LDA head's leave-one-out temperature, which makes ``Z`` its
    calibrated posterior). Returns the soft labels and the class model as a linear head.
    """
    cfg = config_or_default(config)
    rounds, steps, neighbours, kappa = cfg.rounds, cfg.steps, cfg.neighbours, cfg.prior_pseudo_images
    N, D = U.shape
    C = prior_logits.shape[1]
    if N < 2:
        raise SvgenError("the unlabelled pool needs at least 2 images")
    U = U.float()
    logp0 = torch.log_softmax(prior_logits.float(), dim=1)
    beta = prior_strength(N, C) if strength is None else float(strength)
    if not beta >= 0:
        raise SvgenError(f"prior strength must be ≥ 0, got {strength}")
    temperature = float(temperature)
    if not (temperature > 0 and math.isfinite(temperature)):
        raise SvgenError(f"posterior temperature must be a positive number, got {temperature}")
    if graph is None:
        graph = knn_graph(U, neighbours) if neighbours > 0 else (None, None)
    idx, w = graph
    sx = None if shots_x is None else shots_x.float()
    prec = None if precision is None else precision.float()
    Z = torch.softmax(logp0 / temperature, dim=1)       # the prior, at the posterior's temperature
    agreement = []
    it = range(rounds)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="transductive rounds", unit="round")
    mu = var = None
    for _ in it:
        mu, var = class_model(U, Z, sx, shots_y, means.float(), kappa)
        W, b = gmm_head(mu, var, prec)
        base = U @ W.T + b
        if beta:
            base = base + beta * logp0
        prev = Z.argmax(dim=1)
        for _ in range(steps):
            A = (base if idx is None else base + _propagate(Z, idx, w)) / temperature   # exact at T = 1
            Z = torch.softmax(A, dim=1)
        agreement.append(float((Z.argmax(dim=1) == prev).float().mean()))
        if agreement[-1] >= cfg.stable and len(agreement) > 1:
            break
    mu, var = class_model(U, Z, sx, shots_y, means.float(), kappa)
    W, b = gmm_head(mu, var, prec)
    info = {"pool": N, "prior_strength": beta, "rounds": len(agreement), "round_agreement": agreement,
            "neighbours": neighbours, "prior_pseudo_images": kappa, "posterior_temperature": temperature,
            "covariance": "diagonal, re-estimated" if precision is None else "fixed (from the shots)",
            "changed_from_prior": float((Z.argmax(dim=1) != logp0.argmax(dim=1)).float().mean())}
    return Transduction(Z, W, b, info, logits=A)


def settle(U: torch.Tensor, prior_logits: torch.Tensor, means: torch.Tensor, beta0: float,
           config: Optional[AdaptConfig] = None, **kw):
    """(Transduction or None, tries): :func:`transduce` at β₀, β₀·4, … until the rounds settle.

    ``None`` when no strength up to β₀·4^:data:`MAX_ESCALATIONS` settles (keep the inductive heads).
    """
    cfg = config_or_default(config)
    tries = []
    beta = beta0
    k = cfg.neighbours
    graph = knn_graph(U.float(), k) if k > 0 else (None, None)   # once for every try
    for _ in range(cfg.max_escalations + 1):
        res = transduce(U, prior_logits, means, strength=beta, graph=graph, config=cfg, **kw)
        settled = res.info["round_agreement"][-1] >= cfg.stable
        tries.append({"prior_strength": beta, "rounds": res.info["rounds"],
                      "last_agreement": res.info["round_agreement"][-1], "settled": settled})
        if settled:
            return res, tries
        log.info("transductive: β=%.3g did not settle (agreement %.4f); raising it", beta,
                 res.info["round_agreement"][-1])
        beta *= cfg.escalate
    return None, tries
