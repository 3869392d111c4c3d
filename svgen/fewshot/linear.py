"""The linear head with labelled shots: CLIP's zero-shot logits plus a multiple of the LDA head's (GDA's form).

    z(x) = τ · x̂ P̂ᵀ + α·s·(x̂ W_ldaᵀ + b_lda)  =  x̂ Wᵀ + b,     W = τP̂ + α·s·W_lda,  b = α·s·b_lda

with ``P̂`` the unit text prototypes, ``τ`` CLIP's logit scale (100) and ``(W_lda, b_lda)`` the shared-covariance LDA
head of :func:`svgen.fewshot.lda.fit_lda_head` (its γ and κ by its own leave-one-out). It is GDA's predictor
(Wang et al. 2024: zero-shot logits plus α × Gaussian discriminant logits) with svgen's LDA head as the
discriminant, so it stays one matrix: exports, ONNX and the pool's stacked head take it as any linear head.

* ``s`` puts the two terms on one scale without labels: the spread of the zero-shot logits divided by that of the
  LDA logits (:func:`spread_ratio`) on shots the LDA head did not see, so α is a relative weight. On the shots it
  was fitted on, an LDA head's logits spread far wider than on new images (37× CLIP's at 2 shots per class on
  oxford_pets, which made every α look like zero-shot); and a fold's head can differ from the deployed one (at 2
  shots per class a fold leaves one shot per class, no within-class scatter, Σ = I). So the folds' logits are
  scaled by the folds' ratio, and the deployed head by its own, from its exact leave-one-out logits
  (:func:`svgen.calibration.temperatures.lda_loo_logits`), which also give its temperature.
* **α by the balanced folds** (:func:`svgen.fewshot.residual.balanced_folds`, the same folds and shots as the
  kernel head's settings): the LDA head is refitted without each fold at its chosen (γ, κ), every α in
  :data:`ALPHAS` is scored on the fold, and the best held-out accuracy wins (ties: the smaller α, nearer
  zero-shot). α = 0 is CLIP's cosine head: zero-shot is a candidate.
* **One shot per class** has no folds (a held-out shot leaves its class with none): the LDA head alone, as
  before (SimpleShot's CL2N with κ = 4 prior shots); its weight in the default mixture comes from leave-one-out.

Measured on the dev sets (``docs/fewshot.md``, 7 CoOp validation sets, 3 seeds): as a candidate for the default
head it moves the mean top-1 by +0.3 / +0.9 / +0.5 / +0.2 points at 2 / 4 / 8 / 16 shots, and the NLL down on
every set at 2–8 shots.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from svgen.calibration import temperatures as calibration
from svgen.fewshot import lda
from svgen.fewshot.loo import lda_loo_logits
from svgen.heads.scoring import CLIP_LOGIT_SCALE

log = logging.getLogger(__name__)

ALPHAS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)   # × s; 0: the zero-shot cosine head


@dataclass
class LinearFit:
    """The linear head (``x̂ Wᵀ + b``) and why: α, s, and its logits on the balanced folds' held-out shots."""

    weight: torch.Tensor
    bias: torch.Tensor
    record: dict
    held_rows: Optional[np.ndarray] = None      # the folds' held-out shots (indices into all shots)
    held_logits: Optional[np.ndarray] = None    # the head's logits on them, LDA refitted without each fold
    loo_logits: Optional[np.ndarray] = None     # the deployed head's exact leave-one-out logits (its temperature's)
    loo_labels: Optional[np.ndarray] = None     # their shots' classes
    loo_rows: Optional[np.ndarray] = None       # which shots those are (indices into all shots; None: all)


def spread_ratio(zero_shot: np.ndarray, lda_logits: np.ndarray) -> float:
    """``s = std(Z − row means) / std(L − row means)``: how much wider the zero-shot logits spread over classes than
    the LDA logits, on the same images (no labels)."""
    zc = zero_shot - zero_shot.mean(axis=1, keepdims=True)
    lc = lda_logits - lda_logits.mean(axis=1, keepdims=True)
    return float(np.std(zc) / max(float(np.std(lc)), 1e-12))


def fold_lda_logits(prototypes: torch.Tensor, X: torch.Tensor, y: torch.Tensor, folds: list, pool: np.ndarray,
                    settings: dict) -> np.ndarray:
    """The LDA head's logits on each fold's shots, refitted on ``pool`` minus the fold at its chosen (γ, κ),
    folds concatenated."""
    m = lda.prior_means(prototypes, X)
    eq = settings.get("means") == "equal Mahalanobis radius"
    out = []
    for held in folds:
        keep = torch.from_numpy(np.setdiff1d(pool, held))
        W, b = lda.lda_head_weights(X[keep], y[keep], m, settings["shrinkage"], settings["prior_shots"], equal_radius=eq)
        out.append((X[held] @ W.T + b).numpy())
    return np.concatenate(out)


def fit_linear_head(prototypes: torch.Tensor, shots, n_classes: int, W_lda: torch.Tensor, b_lda: torch.Tensor,
                    settings: dict, folds: Optional[list], pool: Optional[np.ndarray], loo_rows: Optional[np.ndarray],
                    logit_scale: float = CLIP_LOGIT_SCALE) -> LinearFit:
    """The linear head for ``shots`` (a :class:`~svgen.core.support.SupportSet` of unit image rows), the LDA head
    ``(W_lda, b_lda)`` fitted on all of them at ``settings`` (γ, κ, means), and the kernel head's balanced ``folds``
    over the shots ``pool`` (None: all; ``folds`` None with one shot per class: the LDA head alone). ``loo_rows``:
    the shots whose exact leave-one-out logits give the deployed head's scale and temperature (None: all)."""
    X, y = shots.rows.double(), shots.labels
    eq = settings.get("means") == "equal Mahalanobis radius"
    loo = lda_loo_logits(prototypes, shots, n_classes, settings["shrinkage"], settings["prior_shots"],
                         equal_radius=eq, rows=loo_rows).numpy()
    loo_y = y.numpy() if loo_rows is None else y.numpy()[loo_rows]
    P = torch.nn.functional.normalize(prototypes.double(), dim=-1).numpy()
    Xn = X.numpy()
    Z_loo = logit_scale * (Xn if loo_rows is None else Xn[loo_rows]) @ P.T
    s = spread_ratio(Z_loo, loo)
    if folds is None:
        return LinearFit(W_lda, b_lda, {"form": "lda", "scale": s,
                                        "rule": "one shot per class: no held-out folds to weigh the LDA logits "
                                                "against the zero-shot ones; the LDA head"},
                         loo_logits=loo, loo_labels=loo_y, loo_rows=loo_rows)
    rows = np.concatenate(folds)
    L = fold_lda_logits(prototypes, X, y, folds, np.arange(len(y)) if pool is None else pool, settings)
    Z = logit_scale * Xn[rows] @ P.T
    s_fold = spread_ratio(Z, L)
    truth = y.numpy()[rows]
    acc = np.array([((Z + a * s_fold * L).argmax(axis=1) == truth).mean() for a in ALPHAS])
    i = int(np.argmax(acc))      # the first best: ties to the smaller α
    alpha = ALPHAS[i]
    W = logit_scale * torch.from_numpy(P) + alpha * s * W_lda.double()
    b = alpha * s * b_lda.double()
    t_lda = calibration.loo_temperatures({"lda": loo}, loo_y, fallback={"lda": 1.0})
    record = {"form": "zero-shot logits + α·s·LDA logits", "alpha": float(alpha), "scale": s, "fold_scale": s_fold,
              "lda_temperature": float(t_lda["temperatures"]["lda"]), "lda_temperature_fitted": t_lda["loo"]["lda"]["fitted"],
              "held_out_accuracy": float(acc[i]), "zero_shot_held_out_accuracy": float(acc[0]),
              "grid": {f"{a:g}": float(v) for a, v in zip(ALPHAS, acc)}, "shots_compared": int(rows.size),
              "rule": "α with the best accuracy on the balanced folds' held-out shots (the LDA head refitted without "
                      "each fold, its logits scaled by fold_scale), ties to the smaller α; a scale is the spread of the "
                      "zero-shot logits / the spread of the LDA logits on shots that head did not see (the deployed "
                      "head's: its exact leave-one-out logits)"}
    log.info("linear head: zero-shot logits + %g·%.3g·LDA (held-out accuracy %.3f, zero-shot %.3f)",
             alpha, s, acc[i], acc[0])
    return LinearFit(W.float(), b.float(), record, rows, Z + alpha * s_fold * L, Z_loo + alpha * s * loo, loo_y,
                     loo_rows)


def lda_part(prototypes: torch.Tensor, shots, n_classes: int, record: Optional[dict]) -> Optional[tuple]:
    """(W_lda, b_lda, T, fitted): the LDA head inside a linear head of this module's form, refitted from the
    shots at the recorded (γ, κ, means) exactly as :func:`fit_linear_head` was given it, with its own
    leave-one-out temperature. None where the linear head *is* the LDA head (one shot per class, or an artifact
    written before this form): use it as it is. The pool's transduction continues the LDA head's Gaussian class
    model (:func:`svgen.transductive.pool.transduce`), whose logits are log-likelihood ratios at their own scale."""
    if not record or record.get("form", "lda") == "lda":
        return None
    X, y = shots.rows.double(), shots.labels
    W, b = lda.lda_head_weights(X, y, lda.prior_means(prototypes, X), record["shrinkage"], record["prior_shots"],
                                equal_radius=record.get("means") == "equal Mahalanobis radius")
    return W.float(), b.float(), float(record["lda_temperature"]), bool(record["lda_temperature_fitted"])
