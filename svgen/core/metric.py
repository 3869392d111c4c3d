"""A text-only metric that separates confusable classes: the neighbour-difference covariance.

CLIP's cosine rule treats every direction of the embedding space alike. Classes that get
confused differ along a few directions — the ones along which a class's prototype differs from
its nearest other prototype. From the prototypes alone (no images):

    Σ_loc = (1/C) Σ_c (p_c − p_nn(c)) (p_c − p_nn(c))ᵀ          nn(c) = argmax_{c'≠c} p_c·p_c'
    Σ     = (1 − δ) Σ_loc + δ (tr Σ_loc / D) I                   δ such that cond(Σ) = κ

Shrinkage to a condition number κ keeps the metric a gentle re-weighting: directions in which
neighbouring class names differ most are down-weighted by at most κ, and κ = 1 is exactly the
cosine rule. How strong the metric may be is decided from the text embeddings alone
(:func:`metric_strength`): the requested κ (default 1.3, chosen by the worst case over inputs
and class folds, docs/accuracy.md) is pulled towards 1 when the prototypes already average T
prompts (their prompt noise, which the metric corrects, shrinks like 1/T) and when too few
distinct neighbour pairs exist to estimate a D×D covariance.

Two uses, both preserving the contract's formulas:

* support-vector anchors ``normalize(Σ⁻¹ e)`` for each text embedding e (the kernel-vote head
  then ranks by the whitened, re-normalised direction);
* the linear head, the whitened cosine ``W_c = normalize(Σ⁻¹ p_c)``, ``b_c = 0`` (κ = 1: the
  CLIP cosine rule). Fisher's LDA with shared covariance Σ (``W_c = 2 Σ⁻¹ p_c``,
  ``b_c = −p_cᵀ Σ⁻¹ p_c``) remains an option: its bias assumes images lie near the text
  prototypes, which CLIP's modality gap breaks, and it lost up to 4 points on ensemble-like
  prototypes (docs/accuracy.md).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def nearest_classes(prototypes: torch.Tensor, n: int, chunk: int = 2048) -> torch.Tensor:
    """C×n indices of each class's n nearest *other* classes by cosine, nearest first (chunked,
    so memory is O(chunk·C) whatever C is)."""
    P = F.normalize(prototypes.float(), dim=-1)
    C = P.shape[0]
    n = min(n, C - 1)
    out = torch.empty(C, n, dtype=torch.long)
    for s in range(0, C, chunk):
        sims = P[s:s + chunk] @ P.T
        rows = torch.arange(sims.shape[0])
        sims[rows, rows + s] = -float("inf")
        out[s:s + chunk] = sims.topk(n, dim=1).indices
    return out


def neighbour_difference_covariance(prototypes: torch.Tensor) -> torch.Tensor:
    """``Σ_loc = mean_c (p_c − p_nn(c))(p_c − p_nn(c))ᵀ`` over unit prototypes (D×D, float64)."""
    P = F.normalize(prototypes.double(), dim=-1)
    diff = P - P[nearest_classes(P, 1)[:, 0]]
    return diff.T @ diff / P.shape[0]


def confusion_directions(prototypes: torch.Tensor, n: int, cov: Optional[torch.Tensor] = None):
    """(top-``n`` eigenvectors of Σ_loc as rows, half the median nearest-prototype distance).

    ``cov``: Σ_loc of these prototypes when already computed.
    """
    P = F.normalize(prototypes.double(), dim=-1)
    if cov is None:
        cov = neighbour_difference_covariance(P)
    _, vecs = torch.linalg.eigh(cov)
    nn_cos = (P * P[nearest_classes(P, 1)[:, 0]]).sum(dim=1)
    nn_dist = torch.sqrt((2 - 2 * nn_cos).clamp_min(0))
    return vecs[:, -n:].flip(1).T.float(), float(nn_dist.median()) / 2


def shrink_to_condition(cov: torch.Tensor, kappa: float):
    """(Σ, δ): ``Σ = (1−δ)·cov + δ·(tr cov / D)·I`` with the smallest δ giving ``cond(Σ) ≤ κ``.

    The eigenvalues move as ``(1−δ)a_i + δμ``; solving ``(1−δ)a_max + δμ = κ((1−δ)a_min + δμ)``
    gives ``δ = (a_max − κ a_min) / (a_max − κ a_min + μ(κ − 1))`` in closed form.

    A zero ``cov`` (every class's nearest prototype coincides with it: a vocabulary of names equal up
    to case, or repeated prototype rows) says nothing about any direction: Σ is then the identity
    (δ = 1, the cosine rule) instead of a singular matrix.
    """
    if kappa < 1:
        raise ValueError(f"condition number must be >= 1, got {kappa}")
    D = cov.shape[0]
    eig = torch.linalg.eigvalsh(cov)
    a_min, a_max, mu = float(eig[0].clamp_min(0)), float(eig[-1]), float(torch.trace(cov)) / D
    eye = torch.eye(D, dtype=cov.dtype)
    if not mu > 0:
        return eye, 1.0
    gap = a_max - kappa * a_min
    delta = 1.0 if kappa == 1 else (0.0 if gap <= 0 else gap / (gap + mu * (kappa - 1)))
    return (1 - delta) * cov + delta * mu * eye, delta


def text_precision(prototypes: torch.Tensor, kappa: float = 1.5, cov: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``Σ⁻¹`` of the shrunk neighbour-difference covariance, rescaled to unit mean eigenvalue (D×D float32).

    The overall scale of Σ⁻¹ changes no ranking, so it is normalised for numerical comfort.
    """
    if cov is None:
        cov = neighbour_difference_covariance(prototypes)
    sigma, _ = shrink_to_condition(cov, kappa)
    prec = torch.linalg.inv(sigma)
    prec = (prec + prec.T) / 2
    return (prec * (prec.shape[0] / torch.trace(prec))).float()


def neighbour_pairs(prototypes: torch.Tensor) -> int:
    """Number of distinct unordered (class, nearest other class) pairs: the independent samples
    behind the neighbour-difference covariance (mutual nearest neighbours count once)."""
    nn = nearest_classes(prototypes, 1)[:, 0]
    c = torch.arange(prototypes.shape[0])
    pairs = torch.stack([torch.minimum(c, nn), torch.maximum(c, nn)], dim=1)
    return int(torch.unique(pairs, dim=0).shape[0])


def metric_strength(kappa: float, n_templates: int, n_pairs: int, dim: int) -> dict:
    """The condition number actually used, decided from the text embeddings alone.

        reliability r = min(1, n_pairs / D)            (a D×D covariance needs ≥ D samples)
        κ_eff         = 1 + (κ − 1) · r / T

    T prompts averaged per prototype divide the prompt noise variance by T; κ − 1 is scaled the
    same way, so an 80-prompt ensemble gets a metric within 1% of the identity (cosine), a
    single prompt gets κ. With fewer neighbour pairs than dimensions the covariance is a guess
    and the metric fades towards cosine. Returns the decision as a dict for ``svgen.json``.
    """
    T = max(int(n_templates), 1)
    reliability = min(1.0, n_pairs / float(dim)) if dim > 0 else 0.0
    eff = 1.0 + (float(kappa) - 1.0) * reliability / T
    reasons = []
    if T > 1:
        reasons.append(f"prototypes average {T} prompts: strength divided by {T}")
    if reliability < 1:
        reasons.append(f"{n_pairs} neighbour pairs for a {dim}-d covariance: strength × {reliability:.2f}")
    return {"kappa_requested": float(kappa), "kappa": eff, "templates_averaged": T,
            "neighbour_pairs": int(n_pairs), "reliability": reliability,
            "reason": "; ".join(reasons) or "single-prompt prototypes, enough classes: full strength"}


def whiten_directions(x: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """``normalize(Σ⁻¹ x)`` row-wise (Σ⁻¹ is symmetric, so rows are multiplied by it directly)."""
    return F.normalize(F.normalize(x, dim=-1) @ precision, dim=-1)


def whitened_cosine_head(prototypes: torch.Tensor, precision: Optional[torch.Tensor], scale: float = 1.0):
    """``W_c = scale · normalize(Σ⁻¹ p̂_c)``, ``b = 0``: cosine between x̂ and the whitened prototype
    direction. Without a metric (``precision`` None) it is ``scale · p̂_c``, the CLIP cosine rule."""
    P = F.normalize(prototypes, dim=-1)
    W = P if precision is None else whiten_directions(P, precision)
    return scale * W, torch.zeros(P.shape[0], dtype=W.dtype, device=W.device)


def lda_head(prototypes: torch.Tensor, precision: torch.Tensor, scale: float = 1.0):
    """Fisher LDA with shared covariance: ``W_c = 2Σ⁻¹p_c``, ``b_c = −p_cᵀΣ⁻¹p_c``, both times ``scale``."""
    P = F.normalize(prototypes, dim=-1)
    SP = P @ precision
    return scale * 2 * SP, -scale * (SP * P).sum(dim=1)
