"""The ``"mixture"`` head ``w·p_kernel + (1 − w)·p_linear`` (each head at its own T), ``w`` by the held-out NLL
(docs/calibration.md); its scores and logits are ``log p``, its temperature 1."""

from __future__ import annotations

import math

import numpy as np

from svgen.core.roots import convex_minimum
from svgen.errors import SvgenError

MIXTURE = "mixture"   # the head with labelled shots: w·p_kernel + (1 − w)·p_linear
PROB_FLOOR = 1e-300   # a true-class probability of 0 in both heads: the NLL stays finite
BISECTIONS = 60


def mix(w: float, p_kernel, p_linear):
    """``w·p_kernel + (1 − w)·p_linear`` (numpy arrays or torch tensors)."""
    return w * p_kernel + (1.0 - w) * p_linear


def fit_weight(p_kernel: np.ndarray, p_linear: np.ndarray, labels: np.ndarray) -> dict:
    """``w`` in [0, 1] minimising the mixture's mean NLL (convex: 1 where its slope there is ≤ 0, a tie keeping the
    kernel head; else 0 or the slope's root). ``{"weight", "nll", "nll_kernel", "nll_linear", "images"}``."""
    y = np.asarray(labels, dtype=np.int64)
    a, b = (np.asarray(p, dtype=np.float64)[np.arange(y.size), y] for p in (p_kernel, p_linear))
    slope = lambda w: float(-((a - b) / np.maximum(mix(w, a, b), PROB_FLOOR)).mean())   # noqa: E731
    nll = lambda w: float(-np.log(np.maximum(mix(w, a, b), PROB_FLOOR)).mean())        # noqa: E731
    w = convex_minimum(slope, 0.0, 1.0, BISECTIONS, flat="hi")
    return {"weight": w, "nll": nll(w), "nll_kernel": nll(1.0), "nll_linear": nll(0.0),
            "images": int(y.size)}


def tilt(p, delta: float, shotless):
    """``p`` (N×C, numpy or torch) with the ``shotless`` columns times ``e^δ``, rows renormalised."""
    if isinstance(p, np.ndarray):
        q = p * np.where(np.asarray(shotless, dtype=bool), math.exp(delta), 1.0)
        return q / q.sum(axis=1, keepdims=True)
    import torch

    shotless = torch.as_tensor(shotless, dtype=torch.bool, device=p.device)
    q = p * torch.ones(p.shape[1], dtype=p.dtype, device=p.device).masked_fill(shotless, math.exp(delta))
    return q / q.sum(dim=1, keepdim=True)


def head_of_weight(w: float) -> str:
    return "kernel" if w == 1.0 else "linear" if w == 0.0 else MIXTURE


def check_weight(w, where: str = "mixture_weight") -> float:
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or not 0.0 <= w <= 1.0:
        raise SvgenError(f"{where} must be a number in [0, 1], got {w!r}")
    return float(w)
