"""What ``svgen diagnose`` and ``svgen eval`` say about ``svgen.json`` ``fewshot.heads_vs_zero_shot``: the heads
``--head`` can select that the fit's own held-out shots found worse than zero-shot (:mod:`svgen.adapt.heldout`)."""

from __future__ import annotations

from typing import List, Optional

from svgen.adapt.heldout import METRICS, ZERO_SHOT
from svgen.state import ShotsOutcome


def findings(fewshot: Optional[dict], shots: Optional[ShotsOutcome]) -> List[str]:
    """Plain-language lines for the heads ``fewshot.heads_vs_zero_shot`` (``svgen.json``) finds worse than
    zero-shot; empty where there is no such record or no such head. ``shots``: what the shots decided (the default
    head they deploy; :mod:`svgen.io.recorded` maps a loaded record to it)."""
    rec = (fewshot or {}).get("heads_vs_zero_shot") or {}
    default = shots.default_head if shots is not None else "kernel"
    names = {"acc1": "top-1", "acc5": "top-5", "nll": "NLL"}
    lines = []
    for head, worse in (rec.get("worse_than_zero_shot") or {}).items():
        h, z = rec["heads"][head], rec["heads"][ZERO_SHOT]
        told = ", ".join(f"{names[m]} {_fmt(m, h[m])} against {_fmt(m, z[m])}" for m in METRICS if m in worse)
        what = ("it is the default head: consider the cosine head (--head cosine), or shots for more classes"
                if head == default else f"--head {head} still serves it; the default head ({default}) is the one "
                                        "to use")
        lines.append(f"the {head} head is worse than zero-shot (the cosine head) on the fit's "
                     f"{rec['images']} held-out shots: {told}; {what}")
    return lines


def _fmt(metric: str, value: float) -> str:
    return f"{value:.3f}" if metric == "nll" else f"{100 * value:.1f}%"
