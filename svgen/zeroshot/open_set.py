"""Classes added to a fitted classifier without retraining: the shared generator expands their prototypes.

:func:`extend` returns the zero-shot heads over old and new classes. New linear-head rows come from
:func:`new_head_rows`; the vote weights are re-solved over all classes with the fitted λ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from svgen.config import FitConfig, config_dict
from svgen.core.generator import prototypes_from_embeddings, template_anchors
from svgen.core.metric import lda_head, whiten_directions, whitened_cosine_head
from svgen.state import Heads, KernelHead, LinearHead, TextSide
from svgen.validation import check_distinct
from svgen.zeroshot.fit import scale_votes
from svgen.zeroshot.training import generate_all, solve_vote_weights, spread_anchors


def new_head_rows(linear: LinearHead, side: TextSide, precision, P_new: torch.Tensor, S_new: torch.Tensor):
    """Linear-head rows for new classes on the scale of the fitted ones.

    With the text metric: the fitted closed form (whitened cosine ``normalize(Σ⁻¹p)``, zero bias; or LDA
    ``β(2Σ⁻¹p, −pᵀΣ⁻¹p)``), β matching the mean row norm of the fitted head. Without:
    ``τ̄ · normalize(mean_k s_{c,k})`` and the mean bias.
    """
    scale = linear.weight.norm(dim=1).mean()
    if precision is not None:
        head = lda_head if side.config.linear_head == "lda" else whitened_cosine_head
        W, b = head(P_new, precision)
        W_old, _ = head(side.prototypes, precision)
        beta = scale / W_old.norm(dim=1).mean()
        return beta * W, beta * b
    W = scale * F.normalize(S_new.mean(dim=1), dim=-1)
    return W, linear.bias.mean().expand(P_new.shape[0])


def extend(zero_shot: Heads, side: TextSide, generator, precision, ridge_lambda, emb: torch.Tensor, classes: list):
    """(all classes, unit prototypes C×D, per-template embeddings C×T×D, zero-shot heads, vote scale) after adding
    ``classes`` with embeddings ``emb`` (checked) to ``zero_shot``. The heads keep ``zero_shot``'s calibration."""
    E_new, P_new = prototypes_from_embeddings(emb)
    check_distinct(torch.cat([side.prototypes, P_new]), side.classes + classes, new_from=side.n_classes)
    T = side.per_template.shape[1]
    if E_new.shape[1] != T:
        # keep one per-template tensor: pad/cycle the new templates to the artifact's T
        E_new = E_new[:, [t % E_new.shape[1] for t in range(T)]]
    anchors = spread_anchors(template_anchors(E_new, side.config.n_support),
                             torch.cat([side.prototypes, P_new]), n_templates=E_new.shape[1], centres=P_new)
    if precision is not None:
        anchors = whiten_directions(anchors, precision)
    S_new = generate_all(generator, P_new, anchors)
    W_new, b_new = new_head_rows(zero_shot.linear, side, precision, P_new, S_new)
    all_classes = side.classes + classes
    k = zero_shot.kernel
    S = torch.cat([k.rows, S_new])
    lam = ridge_lambda if ridge_lambda is not None else 1e-3
    cfg = FitConfig(**{**config_dict(side.config), "ridge": float(lam)})
    A, _, _, _ = solve_vote_weights(S, k.bandwidth, cfg, len(all_classes))
    votes, vote_scale = scale_votes(A, S, lam)
    heads = Heads(KernelHead(S, k.bandwidth, votes),
                  LinearHead(torch.cat([zero_shot.linear.weight, W_new]), torch.cat([zero_shot.linear.bias, b_new])),
                  zero_shot.calibration)
    return (all_classes, torch.cat([side.prototypes, P_new]), torch.cat([side.per_template, E_new]), heads,
            vote_scale)
