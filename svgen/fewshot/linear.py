"""The linear head with shots: CLIP's zero-shot logits plus α·s × the LDA head's (GDA's form), one matrix
``W = τP̂ + α·s·W_lda``, ``b = α·s·b_lda``; α on the kernel head's balanced folds (docs/fewshot.md, "The linear head")."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from svgen.calibration import temperatures as calibration
from svgen.fewshot import lda
from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen.selection import AdaptConfig, config_or_default
from svgen.state import LdaPart

log = logging.getLogger(__name__)


@dataclass
class LinearFit:
    """The linear head ``x̂ Wᵀ + b``, its LDA part, its record, its logits on the folds' held-out shots and its exact
    LOO logits."""

    weight: torch.Tensor
    bias: torch.Tensor
    lda: LdaPart
    record: dict
    held_logits: Optional[np.ndarray] = None
    loo_logits: Optional[np.ndarray] = None
    loo_labels: Optional[np.ndarray] = None
    loo_rows: Optional[np.ndarray] = None       # None: all shots


def spread_ratio(zero_shot: np.ndarray, lda_logits: np.ndarray) -> float:
    """``s = std(Z − row means) / std(L − row means)`` on the same images (no labels)."""
    zc = zero_shot - zero_shot.mean(axis=1, keepdims=True)
    lc = lda_logits - lda_logits.mean(axis=1, keepdims=True)
    return float(np.std(zc) / max(float(np.std(lc)), 1e-12))


def fit_linear_head(prototypes: torch.Tensor, shots, n_classes: int, W_lda: torch.Tensor, b_lda: torch.Tensor,
                    choice: lda.LdaChoice, folds: Optional[list], pool: Optional[np.ndarray],
                    loo_rows: Optional[np.ndarray], config: Optional[AdaptConfig] = None) -> LinearFit:
    """The linear head on the LDA head at ``choice``: α on ``folds`` (LDA refitted on ``pool`` minus each), or LDA."""
    config = config_or_default(config)
    X, y, scored = shots.rows.double(), shots.labels, slice(None) if loo_rows is None else loo_rows
    loo = lda.lda_loo_logits(prototypes, shots, n_classes, choice.shrinkage, choice.prior_shots,
                             rows=loo_rows).numpy()
    loo_y, Xn = y.numpy()[scored], X.numpy()
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1).numpy()
    Z_loo = CLIP_LOGIT_SCALE * Xn[scored] @ P.T
    s = spread_ratio(Z_loo, loo)
    t_lda = calibration.loo_temperatures({"lda": loo}, loo_y, fallback={"lda": 1.0})
    fitted = bool(t_lda["loo"]["lda"]["fitted"])
    part = LdaPart(W_lda, b_lda, choice.shrinkage, float(t_lda["temperatures"]["lda"]) if fitted else None)
    if folds is None:
        return LinearFit(W_lda, b_lda, part, {"form": "lda", "scale": s,
                                        "rule": "one shot per class: no held-out folds to weigh the LDA logits "
                                                "against the zero-shot ones; the LDA head"},
                         loo_logits=loo, loo_labels=loo_y, loo_rows=loo_rows)
    rows = np.concatenate(folds)
    m, out = lda.prior_means(prototypes, X), []
    for held in folds:
        keep = torch.from_numpy(np.setdiff1d(np.arange(len(y)) if pool is None else pool, held))
        W, b = lda.lda_head_weights(X[keep], y[keep], m, choice.shrinkage, choice.prior_shots, equal_radius=True)
        out.append((X[held] @ W.T + b).numpy())
    L = np.concatenate(out)
    Z = CLIP_LOGIT_SCALE * Xn[rows] @ P.T
    s_fold = spread_ratio(Z, L)
    truth, alphas = y.numpy()[rows], config.alphas
    acc = np.array([((Z + a * s_fold * L).argmax(axis=1) == truth).mean() for a in alphas])
    i = int(np.argmax(acc))      # the first best: ties to the smaller α
    alpha = alphas[i]
    W = CLIP_LOGIT_SCALE * torch.from_numpy(P) + alpha * s * W_lda.double()
    b = alpha * s * b_lda.double()
    record = {"form": "zero-shot logits + α·s·LDA logits", "alpha": float(alpha), "scale": s, "fold_scale": s_fold,
              "lda_temperature": float(t_lda["temperatures"]["lda"]), "lda_temperature_fitted": fitted,
              "held_out_accuracy": float(acc[i]), "zero_shot_held_out_accuracy": float(acc[0]),
              "grid": {f"{a:g}": float(v) for a, v in zip(alphas, acc)}, "shots_compared": int(rows.size),
              "rule": "α with the best accuracy on the balanced folds' held-out shots (the LDA head refitted without "
                      "each fold, its logits scaled by fold_scale), ties to the smaller α; a scale is the spread of the "
                      "zero-shot logits / the spread of the LDA logits on shots that head did not see (the deployed "
                      "head's: its exact leave-one-out logits)"}
    log.info("linear head: zero-shot logits + %g·%.3g·LDA (held-out accuracy %.3f, zero-shot %.3f)",
             alpha, s, acc[i], acc[0])
    return LinearFit(W.float(), b.float(), part, record, Z + alpha * s_fold * L, Z_loo + alpha * s * loo, loo_y,
                     loo_rows)

