"""The kernel vote's kinds of logits (``kernel_logits`` in svgen.json and every export): ``"log"`` (the default),
``log max(score, 10⁻³⁰)``; ``"score"``, the raw vote; ``"floored"``, ``log max(score, ε·p₀·max score / max p₀)``
for an adapted head with zero-shot term p₀. Which one a fit uses: :mod:`svgen.adapt.temperatures`."""

from __future__ import annotations

from typing import Optional

import torch

from svgen.errors import SvgenError

KERNEL_LOG_FLOOR = 1e-30
KERNEL_LOGITS = ("log", "score", "floored")   # kinds of kernel-vote logits; the first is the default


def check_kernel_logits(kind, where: str = "kernel_logits") -> str:
    """``kind`` if it is one of :data:`KERNEL_LOGITS`, else one :class:`SvgenError` line."""
    if not isinstance(kind, str) or kind not in KERNEL_LOGITS:
        raise SvgenError(f"{where} must be {' or '.join(map(repr, KERNEL_LOGITS))}, got {kind!r}")
    return kind


def check_floor(floor) -> float:
    """``floor`` (ε) if it is a number in (0, 1), else one :class:`SvgenError` line."""
    if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0 < floor < 1):
        raise SvgenError(f"kernel_floor must be a number in (0, 1), got {floor!r}")
    return float(floor)


def floored_log(scores, prior, floor: float) -> torch.Tensor:
    """``log max(s_c, ε·p₀_c·max_j s_j / max_j p₀_j, 10⁻³⁰)`` row by row (``prior``: the head's zero-shot term p₀).
    A class the shots' correction pushed to ≤ 0 keeps a fraction of its zero-shot probability; with ε < 1 the floor
    never reaches the row's top score, so the argmax is the scores' exactly."""
    s = torch.as_tensor(scores, dtype=torch.float64)
    p = torch.as_tensor(prior, dtype=torch.float64)
    f = float(floor) * p * (s.max(dim=1, keepdim=True).values / p.max(dim=1, keepdim=True).values.clamp_min(1e-300))
    return torch.maximum(s, f).clamp_min(KERNEL_LOG_FLOOR).log()


def kernel_logits(scores, kind: str = "log", prior=None, floor: Optional[float] = None) -> torch.Tensor:
    """The kernel vote's logits of kind ``kind`` (``"floored"`` needs the head's zero-shot ``prior`` term and ε)."""
    scores = torch.as_tensor(scores)
    kind = check_kernel_logits(kind)
    if kind == "log":
        return scores.clamp_min(KERNEL_LOG_FLOOR).log()
    if kind == "floored":
        if prior is None:
            raise SvgenError("the 'floored' kernel logits need the head's zero-shot prior term")
        return floored_log(scores, prior, check_floor(floor))
    return scores


def head_logits(scores: torch.Tensor, head: str, kernel_kind: str = "log", prior=None,
                floor: Optional[float] = None) -> torch.Tensor:
    """The logits a head's probabilities are a softmax of: :func:`kernel_logits` for the kernel vote, the scores
    themselves for the linear and cosine heads."""
    return kernel_logits(scores, kernel_kind, prior, floor) if head == "kernel" else torch.as_tensor(scores)
