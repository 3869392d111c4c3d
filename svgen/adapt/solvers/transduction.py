"""The transduction in closed form on plain tensors, TransCLIP's KL-anchored update (docs/transductive.md)."""

from __future__ import annotations

import logging
import math
from collections import namedtuple
from typing import Callable, Optional

import torch

from svgen.errors import SvgenError

log = logging.getLogger(__name__)

KNN_BLOCK = 2048


# the solve's settings, named as svgen.adapt.config.AdaptConfig names them
Settings = namedtuple("Settings", "neighbours rounds steps prior_pseudo_images stable escalate max_escalations")
# N×C soft labels = softmax(logits); the class model as a linear head (C×D weight W = μ/v or μ Σ⁻¹, C bias); record
Transduction = namedtuple("Transduction", "labels weight bias info logits")


def prior_strength(n_pool: int, n_classes: int, n_shots: int = 0) -> float:
    """β₀: ``n_shots/N`` for a prior fitted on shots, else ``1 + C/N``."""
    return n_shots / max(n_pool, 1) if n_shots else 1.0 + n_classes / max(n_pool, 1)


def knn_graph(U: torch.Tensor, k: int, block: int = KNN_BLOCK):
    """(idx N×k, w N×k): each row's k nearest other rows by cosine, ``max(0, cos)`` weights; k = 0: (None, None)."""
    if k <= 0:
        return None, None
    k, near = min(k, U.shape[0] - 1), []
    for s in range(0, U.shape[0], block):
        S = U[s:s + block] @ U.T
        r = torch.arange(S.shape[0])
        S[r, s + r] = -float("inf")   # not its own neighbour
        near.append(S.topk(k, dim=1))
    return torch.cat([i for _, i in near]), torch.cat([v for v, _ in near]).clamp_min(0)


def _propagate(Z: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(Z)
    for j in range(idx.shape[1]):
        out.addcmul_(w[:, j:j + 1], Z[idx[:, j]])
    return out


def gmm_head(mu: torch.Tensor, var: torch.Tensor, precision: Optional[torch.Tensor] = None):
    """(W, b): ``x̂ Wᵀ + b`` = each class's Gaussian log-likelihood up to a per-row constant."""
    W = mu / var if precision is None else mu @ precision
    return W, -0.5 * (mu * W).sum(dim=1)


def class_model(U, Z, shots_x, shots_y, means, kappa: float):
    """(μ C×D, v D): soft class means with κ prior pseudo-images, one shared diagonal variance."""
    if shots_x is None:
        shots_x, shots_y = U.new_zeros(0, U.shape[1]), torch.zeros(0, dtype=torch.int64)
    zs, ZU = Z.sum(dim=0), Z.T @ U
    SX = torch.zeros(means.shape, dtype=U.dtype).index_add_(0, shots_y, shots_x)
    nX = torch.bincount(shots_y, minlength=means.shape[0]).to(U.dtype)
    mu = (ZU + SX + kappa * means) / (zs + nX + kappa)[:, None]
    var = ((U * U).sum(dim=0) - 2 * (mu * ZU).sum(dim=0) + (zs[:, None] * mu * mu).sum(dim=0)
           + ((shots_x - mu[shots_y]) ** 2).sum(dim=0)) / (U.shape[0] + shots_x.shape[0])
    return mu, var.clamp_min(1e-3 * float(var.clamp_min(0).mean()) + 1e-12)


def transduce(U: torch.Tensor, prior_logits: torch.Tensor, means: torch.Tensor, settings: Settings, shots_x=None,
              shots_y=None, strength: Optional[float] = None, precision: Optional[torch.Tensor] = None, graph=None,
              temperature: float = 1.0, each: Callable = iter) -> Transduction:
    """``settings.rounds`` rounds of pseudo-labels and the class model re-solved (``precision``: a fixed Σ⁻¹);
    ``each`` wraps the rounds (a progress bar)."""
    N, C, U, temperature = U.shape[0], prior_logits.shape[1], U.float(), float(temperature)
    beta = prior_strength(N, C) if strength is None else float(strength)
    if N < 2:
        raise SvgenError("the unlabelled pool needs at least 2 images")
    if not beta >= 0:
        raise SvgenError(f"prior strength must be ≥ 0, got {strength}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise SvgenError(f"posterior temperature must be a positive number, got {temperature}")
    logp0 = torch.log_softmax(prior_logits.float(), dim=1)
    idx, w = graph or knn_graph(U, settings.neighbours)
    sx, prec = (None if t is None else t.float() for t in (shots_x, precision))

    def model(Z):
        return gmm_head(*class_model(U, Z, sx, shots_y, means.float(), settings.prior_pseudo_images), prec)

    Z, agreement = torch.softmax(logp0 / temperature, dim=1), []
    for _ in each(range(settings.rounds)):
        W, b = model(Z)
        base, prev = U @ W.T + b + (beta * logp0 if beta else 0), Z.argmax(dim=1)
        for _ in range(settings.steps):
            A = (base if idx is None else base + _propagate(Z, idx, w)) / temperature
            Z = torch.softmax(A, dim=1)
        agreement.append(float((Z.argmax(dim=1) == prev).float().mean()))
        if agreement[-1] >= settings.stable and len(agreement) > 1:
            break
    W, b = model(Z)
    info = {"pool": N, "prior_strength": beta, "rounds": len(agreement), "round_agreement": agreement,
            "neighbours": settings.neighbours, "prior_pseudo_images": settings.prior_pseudo_images,
            "posterior_temperature": temperature,
            "covariance": "diagonal, re-estimated" if precision is None else "fixed (from the shots)",
            "changed_from_prior": float((Z.argmax(dim=1) != logp0.argmax(dim=1)).float().mean())}
    return Transduction(Z, W, b, info, A)
