"""Temperatures, the kernel head's logit kind and the mixture weight by the held-out NLL (docs/calibration.md)."""

from __future__ import annotations

import math
from typing import Dict

import numpy as np
import torch

from svgen import records
from svgen.adapt.config import AdaptConfig
from svgen.adapt.select import choose
from svgen.core.logits import KERNEL_LOG_FLOOR, floored_log, kernel_logits
from svgen.core.roots import convex_minimum
from svgen.heads.calibration import PROB_FLOOR, ece, example_nll, fit_temperature, mix, nll_from_logits, softmax

BISECTIONS = 60


def loo_temperatures(loo_logits: Dict[str, torch.Tensor], labels, fallback: Dict[str, float]) -> dict:
    """Per head, T by :func:`fit_temperature` and ``{nll, ece, acc1, fitted}`` there; where every shot is ranked
    first when left out (no finite T) ``fallback[head]`` and ``fitted`` False."""
    y = np.asarray(labels)
    temps, loo = {}, {}
    for head, z in loo_logits.items():
        z = torch.as_tensor(z, dtype=torch.float64)
        acc = float((z.argmax(dim=1).numpy() == y).mean())
        T = temps[head] = fit_temperature(z, y) if acc < 1.0 else float(fallback[head])
        loo[head] = {"nll": nll_from_logits(z, T, y), "ece": ece(softmax(z, T), y), "acc1": acc, "fitted": acc < 1.0}
    return {"temperatures": temps, "loo": loo}


def kernel_logit_candidates(s, y, prior, fallback: float, cfg: AdaptConfig) -> tuple:
    """(the kinds' logits, their entries {temperature, nll, ece, acc1, fitted}, the floored kind's ε or None, the fit): log,
    score, and with a ``prior`` floored at its ε of ``cfg.kernel_floors`` (``CHOICES["kernel_floor"]``)."""
    z = {kind: kernel_logits(s, kind) for kind in ("log", "score")}
    eps = {f"floored {e:g}": e for e in sorted(cfg.kernel_floors, reverse=True)} if prior is not None else {}
    zf = {k: floored_log(s, prior, e) for k, e in eps.items()}
    fit = loo_temperatures({**z, **zf}, y, fallback={k: fallback for k in [*z, *eps]})
    entry = lambda k: {"temperature": fit["temperatures"][k], **fit["loo"][k], **(  # noqa: E731
        {} if fit["loo"][k]["fitted"] else dict.fromkeys(("temperature", "nll", "ece")))}
    cand, floor = {k: entry(k) for k in z}, None
    if eps:
        fitted = [k for k in eps if fit["loo"][k]["fitted"]]
        best = (choose({k: -example_nll(zf[k], fit["temperatures"][k], y) for k in fitted}, None, "kernel_floor",
                       cfg.level).chosen if fitted else list(eps)[0])
        z["floored"], floor = zf[best], eps[best]
        cand["floored"] = {**entry(best), "floor": floor,
                           "by_floor": {f"{e:g}": fit["loo"][k]["nll"] for k, e in sorted(eps.items(), key=lambda x: x[1])}}
    return z, cand, floor, fit


def choose_kernel_logits(loo_scores, labels, fallback: float, signed_votes: bool = True, prior=None, *,
                         config: AdaptConfig) -> dict:
    """The kernel head's kind of logits and T by the held-out NLL (``CHOICES["kernel_logits"]``: log, score,
    floored), "log" charged for the true-class votes ≤ 0 new images may have: their rate's :func:`event_rate_bound`
    at ``config.level`` above the rate seen, × what log loses on each (its median top logit above the floor, over T).
    "log" where a kind has no finite T."""
    y, cfg = np.asarray(labels), config
    s = torch.as_tensor(loo_scores, dtype=torch.float64)
    vote_not_positive = s[torch.arange(len(y)), torch.as_tensor(y, dtype=torch.long)] <= 0   # where log puts p ≈ 0
    z, cand, floor, fit = kernel_logit_candidates(s, y, prior, fallback, cfg)
    diff = guard = None
    if all(c["fitted"] for c in cand.values()):
        per = {k: -example_nll(z[k], cand[k]["temperature"], y) for k in cand}
        d = per["log"] - per["score"]
        diff = {"mean": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None}
        seen = int(vote_not_positive.sum())
        bound = event_rate_bound(seen, len(y), cfg.level) if signed_votes else 0.0
        loss = float(torch.quantile(z["log"].max(dim=1).values - math.log(KERNEL_LOG_FLOOR), 0.5)) / float(
            cand["log"]["temperature"])
        guard = {"seen": seen, "rate_bound": bound, "loss": loss,
                 "charge": max(bound - seen / max(len(y), 1), 0.0) * loss}
        kind = choose({**per, "log": per["log"] - guard["charge"]}, None, "kernel_logits", cfg.level).chosen
        reason = records.kernel_logits_reason(cand, guard, len(y), floor)
        T, loo = cand[kind]["temperature"], {k: v for k, v in cand[kind].items()
                                             if k not in ("temperature", "floor", "by_floor")}
    else:
        kind, T, loo = "log", fit["temperatures"]["log"], fit["loo"]["log"]
        reason = records.kernel_logits_unfitted(loo["fitted"])
    return {"kind": kind, "temperature": T, "floor": floor if kind == "floored" else None, "loo": loo,
            "candidates": cand, "nll_score_minus_log": diff,
            "loo_true_vote_not_positive": float(vote_not_positive.double().mean()), "log_tail_guard": guard,
            "reason": reason}


def event_rate_bound(k: int, n: int, level: float) -> float:
    """Wilson score upper bound: the rate p with ``k/n = p − level·√(p(1 − p)/n)`` (k = 0, level 1: 1/(n + 1))."""
    if n <= 0 or k >= n:
        return 1.0
    r, z2 = k / n, level * level / n
    return min((r + z2 / 2 + level * math.sqrt(r * (1 - r) / n + z2 / (4 * n))) / (1 + z2), 1.0)


def fit_weight(p_kernel: np.ndarray, p_linear: np.ndarray, labels: np.ndarray) -> dict:
    """``w`` in [0, 1] minimising the mixture's mean NLL (convex: 1 where its slope there is ≤ 0, a tie keeping the
    kernel head; else 0 or the slope's root). ``{"weight", "nll", "nll_kernel", "nll_linear", "images"}``."""
    y = np.asarray(labels, dtype=np.int64)
    a, b = (np.asarray(p, dtype=np.float64)[np.arange(y.size), y] for p in (p_kernel, p_linear))
    slope = lambda w: float(-((a - b) / np.maximum(mix(w, a, b), PROB_FLOOR)).mean())   # noqa: E731
    nll = lambda w: float(-np.log(np.maximum(mix(w, a, b), PROB_FLOOR)).mean())        # noqa: E731
    w = convex_minimum(slope, 0.0, 1.0, BISECTIONS, flat="hi")
    return {"weight": w, "nll": nll(w), "nll_kernel": nll(1.0), "nll_linear": nll(0.0), "images": int(y.size)}
