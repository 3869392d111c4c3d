"""The ``"mixture"`` head: the kernel and linear heads' calibrated probabilities, averaged.

With labelled shots svgen has two adapted heads that err differently: the kernel head corrects CLIP's zero-shot
probabilities image by image (:mod:`svgen.fewshot.residual`), the linear head adds a Gaussian discriminant to CLIP's
logits (:mod:`svgen.fewshot.linear`). Their mixture

    p(c | x) = w · p_kernel(c | x) + (1 − w) · p_linear(c | x),        each head at its own temperature,

with ``w`` minimising the NLL of held-out shots (:func:`fit_weight`), is what a fit with shots deploys when
``0 < w < 1``; ``w = 1`` is the kernel head alone and ``w = 0`` the linear head alone, so the choice between the
heads is the same fit. The evidence is the one the heads' temperatures are fitted on (:mod:`svgen.fewshot.adapt`):
the balanced folds' held-out shots, each head refitted without its fold, or with one shot per class the exact
leave-one-out scores. The mixture's NLL is convex in ``w``, so the minimiser is found exactly (bisection on the
derivative), with no grid. Its scores (``decision_function``) and logits are ``log p``; its temperature is 1.
"""

from __future__ import annotations

import math

import numpy as np

from svgen.core.roots import convex_minimum
from svgen.errors import SvgenError

MIXTURE = "mixture"   # the head with labelled shots: w·p_kernel + (1 − w)·p_linear

PROB_FLOOR = 1e-300   # a true-class probability of 0 in both heads: the NLL stays finite
BISECTIONS = 60


def mix(w: float, p_kernel, p_linear):
    """``w·p_kernel + (1 − w)·p_linear``: the mixture head's probabilities (numpy arrays or torch tensors)."""
    return w * p_kernel + (1.0 - w) * p_linear


def nll(w: float, a: np.ndarray, b: np.ndarray) -> float:
    """Mean ``−log(w·a + (1 − w)·b)`` for the heads' true-class probabilities ``a`` (kernel) and ``b`` (linear)."""
    return float(-np.log(np.maximum(mix(w, a, b), PROB_FLOOR)).mean())


def fit_weight(p_kernel: np.ndarray, p_linear: np.ndarray, labels: np.ndarray) -> dict:
    """``w`` in [0, 1] minimising the mean NLL of ``w·p_kernel + (1 − w)·p_linear`` (N×C probabilities of the same
    held-out images, classes ``labels``). The NLL is convex in ``w``: ``w = 1`` where its derivative there is ≤ 0 (so
    a tie keeps the kernel head, as the head choice always has), ``w = 0`` where it is ≥ 0 at 0, else the root of
    the derivative by bisection. Returns ``{"weight", "nll", "nll_kernel", "nll_linear", "images"}``."""
    y = np.asarray(labels, dtype=np.int64)
    rows = np.arange(y.size)
    a = np.asarray(p_kernel, dtype=np.float64)[rows, y]
    b = np.asarray(p_linear, dtype=np.float64)[rows, y]

    def slope(w):   # d/dw of the mean NLL
        return float(-((a - b) / np.maximum(mix(w, a, b), PROB_FLOOR)).mean())

    w = convex_minimum(slope, 0.0, 1.0, BISECTIONS, flat="hi")
    return {"weight": w, "nll": nll(w, a, b), "nll_kernel": nll(1.0, a, b), "nll_linear": nll(0.0, a, b),
            "images": int(y.size)}


def tilt(p, delta: float, shotless):
    """``p`` (N×C probabilities, numpy or torch) with the columns where ``shotless`` (C booleans) is true times
    ``e^δ``, renormalised: ``p'_c = p_c·e^{δ·u_c} / Σ_j p_j·e^{δ·u_j}`` (:mod:`svgen.fewshot.coverage`)."""
    if isinstance(p, np.ndarray):
        f = np.where(np.asarray(shotless, dtype=bool), math.exp(delta), 1.0)
        q = p * f
        return q / q.sum(axis=1, keepdims=True)
    import torch

    f = torch.ones(p.shape[1], dtype=p.dtype)
    f[torch.as_tensor(shotless, dtype=torch.bool)] = math.exp(delta)
    q = p * f
    return q / q.sum(dim=1, keepdim=True)


def head_of_weight(w: float) -> str:
    """The head a weight deploys: ``"kernel"`` at 1, ``"linear"`` at 0, else ``"mixture"``."""
    return "kernel" if w == 1.0 else "linear" if w == 0.0 else MIXTURE


def check_weight(w, where: str = "mixture_weight") -> float:
    """``w`` if it is a number in [0, 1], else one :class:`~svgen.errors.SvgenError` line."""
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or not 0.0 <= w <= 1.0:
        raise SvgenError(f"{where} must be a number in [0, 1], got {w!r}")
    return float(w)
