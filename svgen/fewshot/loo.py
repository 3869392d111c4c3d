"""The few-shot LDA head's exact leave-one-out logits: its temperature and its scale in the linear head
(:mod:`svgen.fewshot.linear`) are fitted on them, so no shot's score has seen its own label."""

from __future__ import annotations

import torch

from svgen.fewshot.lda import lda_loo, prior_means


def lda_loo_logits(prototypes: torch.Tensor, shots, n_classes: int, shrinkage: float, prior_shots: float,
                   equal_radius: bool = False, rows=None) -> torch.Tensor:
    """Exact leave-one-out logits (N×C) of the few-shot LDA head at its chosen (γ, κ)
    (:func:`svgen.fewshot.lda.lda_loo`, rank-one downdates; the shrinkage target held at its all-shot value).
    ``equal_radius``: the head's means were put at one Mahalanobis radius (as :func:`svgen.fewshot.lda.fit_lda_head`
    does by default); the LOO logits must be those of the same head. ``rows``: those shots' LOO logits only."""
    X = shots.rows.double()
    _, _, kept = lda_loo(X, shots.labels, prior_means(prototypes, X), [shrinkage], [prior_shots],
                         equal_radius=equal_radius, keep_scores=True,
                         score_rows=None if rows is None else torch.as_tensor(rows))
    return kept[0, 0]
