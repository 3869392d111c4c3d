"""The LDA head, (γ, κ) by exact leave-one-out, and the linear head on it, ``W = τP̂ + α·s·W_lda``, α = 0 (zero-shot)
a candidate (docs/fewshot.md, "The LDA head", "The linear head")."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch

from svgen import records
from svgen.adapt import temperatures as calibration
from svgen.adapt.config import AdaptConfig
from svgen.adapt.heldout import HeldOut
from svgen.adapt.select import choose
from svgen.adapt.solvers.lda import (fold_logits, lda_covariance, lda_head_weights, lda_loo_scores,  # noqa: F401
                                     prior_means, spread_ratio)
from svgen.core.support import SupportSet
from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen.state import LdaChoice, LdaPart, LinearForm

log = logging.getLogger(__name__)


def lda_setting(hits: dict, level: float) -> tuple:
    """(γ, κ) from ``{(γ, κ): per-shot LOO hits}``: γ the most shrinkage not behind the best (γ, κ), κ the best at that
    γ (``CHOICES["lda"]``, ``CHOICES["lda_prior"]``; ties: more shrinkage, then more prior)."""
    order = sorted(hits, key=lambda gk: (-gk[0], -gk[1]))   # nearest zero-shot first: more shrinkage, more prior
    shrink = choose({k: hits[k] for k in order}, None, "lda", level)
    row = [k for k in shrink.not_behind if k[0] == shrink.chosen[0]]
    return choose({k: hits[k] for k in row}, None, "lda_prior", level).chosen


def fit_lda_head(prototypes: torch.Tensor, shots: SupportSet, n_classes: int, ev: HeldOut, config: AdaptConfig):
    """(W, b, :class:`LdaChoice`), (γ, κ) by :func:`lda_setting` on the exact leave-one-out of ``ev.loo_rows``."""
    X, y = shots.rows.double(), shots.labels
    m = prior_means(prototypes, X)
    counts = shots.counts(n_classes)
    kappas = ((config.lda_prior_one_shot,) if ev.one_shot
              else tuple(k for k in config.lda_prior if k > 0 or not (counts == 0).any()))   # κ = 0 needs every class
    gammas = (1.0,) if ev.one_shot else config.lda_shrinkage     # no within-class scatter to estimate with 1 shot
    t = y.numpy() if ev.loo_rows is None else y.numpy()[ev.loo_rows]
    hits = {(gammas[a], kappas[b]): sc.argmax(dim=1).numpy() == t
            for (a, b), sc in lda_loo_scores(X, y, m, gammas, kappas, ev.loo_rows)}
    gamma, kappa = lda_setting(hits, config.level)
    W, bias = lda_head_weights(X, y, m, gamma, kappa, equal_radius=True)
    return W.float(), bias.float(), LdaChoice(float(gamma), float(kappa), 1.0 - float(hits[gamma, kappa].mean()),
                                              ev.one_shot)


@dataclass
class LinearFit:
    """The linear head ``x̂ Wᵀ + b``, its LDA part, its record, its logits at ``ev.rows`` and at ``ev.loo_rows``."""

    weight: torch.Tensor
    bias: torch.Tensor
    lda: LdaPart
    record: dict
    held_logits: Optional[np.ndarray] = None
    loo_logits: Optional[np.ndarray] = None
    loo_labels: Optional[np.ndarray] = None


def fit_linear_head(prototypes: torch.Tensor, shots, n_classes: int, W_lda: torch.Tensor, b_lda: torch.Tensor,
                    choice: LdaChoice, ev: HeldOut, config: AdaptConfig) -> LinearFit:
    """The linear head on the LDA head at ``choice``: α by :func:`choose` (``CHOICES["alpha"]``) on ``ev``."""
    X = shots.rows.double()
    scored = slice(None) if ev.loo_rows is None else ev.loo_rows
    m = prior_means(prototypes, X)
    loo = next(lda_loo_scores(X, shots.labels, m, [choice.shrinkage], [choice.prior_shots], ev.loo_rows))[1].numpy()
    loo_y = shots.labels.numpy()[scored]
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1).numpy()
    Z_loo = CLIP_LOGIT_SCALE * X.numpy()[scored] @ P.T
    s = spread_ratio(Z_loo, loo)
    t_lda = calibration.loo_temperatures({"lda": loo}, loo_y, fallback={"lda": 1.0})   # the LDA part's own T
    T = float(t_lda["temperatures"]["lda"]) if t_lda["loo"]["lda"]["fitted"] else None
    part = LdaPart(W_lda, b_lda, choice.shrinkage, T)
    if not ev.judges_zero_shot:   # one shot per class: no held-out shot can weigh α against zero-shot
        return LinearFit(W_lda, b_lda, replace(part, form=LinearForm.LDA), records.linear_alone(s), loo, loo, loo_y)
    L = fold_logits(X, shots.labels, m, choice.shrinkage, choice.prior_shots, list(ev.folds))   # the folds' refits
    Z = CLIP_LOGIT_SCALE * X.numpy()[ev.rows] @ P.T
    s_fold = spread_ratio(Z, L)
    alphas = tuple(dict.fromkeys((0.0, *sorted(config.alphas))))   # α = 0, zero-shot, first
    picked = choose({a: (Z + a * s_fold * L).argmax(axis=1) == ev.labels for a in alphas}, ev, "alpha", config.level)
    alpha = picked.chosen
    W = CLIP_LOGIT_SCALE * torch.from_numpy(P) + alpha * s * W_lda.double()
    record = records.linear(alpha, s, s_fold, t_lda, picked, ev.rows.size)
    log.info("linear head: zero-shot logits + %g·%.3g·LDA (held-out accuracy %.3f, zero-shot %.3f)",
             alpha, s, picked.mean, picked.means[0.0])
    return LinearFit(W.float(), (alpha * s * b_lda.double()).float(), part, record, Z + alpha * s_fold * L,
                     Z_loo + alpha * s * loo, loo_y)
