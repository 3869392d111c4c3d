"""Per-head temperatures, ``p = softmax(z / T)``: from the text side, from held-out shots, and the kernel's kind of
logits; and the ``"mixture"`` head ``w·p_kernel + (1 − w)·p_linear`` (each head at its own T), ``w`` by the held-out
NLL, its scores and logits ``log p``, its temperature 1. docs/calibration.md states the rules and what they were
measured to do."""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np
import torch

from svgen.core.logits import (KERNEL_LOG_FLOOR, KERNEL_LOGITS, check_floor, check_kernel_logits,  # noqa: F401
                                floored_log, head_logits, kernel_logits)  # also read from here
from svgen.core.roots import bisect, convex_minimum
from svgen.errors import SvgenError
from svgen.selection import AdaptConfig, config_or_default

ECE_BINS = 15
T_RANGE = (1e-8, 1e8)   # a fitted T, clipped (:func:`in_range`): the artifact's TEMPERATURE_RANGE (e^30 was unloadable)
LOG_T_RANGE = (math.log(T_RANGE[0]), math.log(T_RANGE[1]))   # bisection bracket for log T
in_range = lambda T: min(max(T, T_RANGE[0]), T_RANGE[1])     # noqa: E731  (exp(log 1e8) is a hair above 1e8)
MIXTURE = "mixture"   # the head with labelled shots: w·p_kernel + (1 − w)·p_linear
PROB_FLOOR = 1e-300   # a true-class probability of 0 in both heads: the NLL stays finite
BISECTIONS = 60


def softmax(logits, temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` row-wise, in float64 (small temperatures do not overflow)."""
    if not temperature > 0:
        raise SvgenError(f"temperature must be positive, got {temperature}")
    return torch.softmax(torch.as_tensor(logits, dtype=torch.float64) / float(temperature), dim=1)


def mean_log_odds(logits, temperature: float) -> float:
    """Mean ``log(p_max / (1 − p_max))`` of ``softmax(z / T)``, as ``z_max/T − logsumexp_{j≠max} z_j/T``."""
    z = torch.as_tensor(logits, dtype=torch.float64) / float(temperature)
    top = z.max(dim=1)
    return float((top.values - torch.logsumexp(z.scatter(1, top.indices[:, None], -math.inf), dim=1)).mean())


def match_confidence(logits, target: float, iters: int = 60) -> float:
    """The T at which :func:`mean_log_odds` equals ``target`` (it falls monotonically with T: bisection on log T).
    A target out of reach gives the bracket's end; logits that all tie give 1."""
    top = (z := torch.as_tensor(logits, dtype=torch.float64)).max(dim=1)
    gap = (z - top.values[:, None]).scatter(1, top.indices[:, None], -math.inf)  # z_j − z_max, j ≠ max
    if not bool((gap[torch.isfinite(gap)] < 0).any()):
        return 1.0
    return in_range(math.exp(bisect(lambda m: float((-torch.logsumexp(gap / math.exp(m), dim=1)).mean()) > target,
                                    *LOG_T_RANGE, iters, tol=1e-10)))  # mean_log_odds at T = e^m; T to 1e-10 relative


def fit_temperature(logits_loo, labels, iters: int = 100) -> float:
    """T minimising the mean NLL of held-out (leave-one-out) logits: convex in β = 1/T, its slope
    ``mean_i (E_p[z_i] − z_{i,y_i})`` found 0 by bisection; the bracket's end where no finite β is preferred."""
    z = torch.as_tensor(logits_loo, dtype=torch.float64)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    if z.dim() != 2 or y.shape != (z.shape[0],) or z.shape[0] == 0:
        raise SvgenError(f"fit_temperature needs N×C logits and N labels, got {tuple(z.shape)} and {tuple(y.shape)}")
    z_true = z[torch.arange(z.shape[0]), y]
    slope = lambda b: float(((torch.softmax(z * math.exp(b), dim=1) * z).sum(dim=1) - z_true).mean())  # noqa: E731
    return in_range(math.exp(-bisect(lambda b: slope(b) < 0, -LOG_T_RANGE[1], -LOG_T_RANGE[0], iters)))


def query_rows(per_template: torch.Tensor, seed: int = 0, config: Optional[AdaptConfig] = None) -> torch.Tensor:
    """Every prompt embedding (C·T×D), or a seeded sorted sample of ``config.max_queries`` (fewer where C × them
    passes ``config.max_logits``; 256 at least)."""
    cfg = config_or_default(config)
    Q = per_template.reshape(-1, per_template.shape[-1])
    max_queries = min(cfg.max_queries, max(256, cfg.max_logits // per_template.shape[0]))
    if Q.shape[0] > max_queries:
        Q = Q[torch.randperm(Q.shape[0], generator=torch.Generator().manual_seed(seed))[:max_queries].sort().values]
    return Q


def text_temperatures(score_fn, per_template: torch.Tensor, heads=("kernel", "linear", "cosine"),
                      config: Optional[AdaptConfig] = None) -> dict:
    """Each head's T such that its mean top-class log-odds on the text queries equals the cosine head's at scale
    100 (``score_fn(Q, head)``: N×C scores). ``{"temperatures": {head: T}, ...}`` for ``svgen.json``."""
    Q = query_rows(per_template, config=config)
    cos = head_logits(score_fn(Q, "cosine"), "cosine")
    target = mean_log_odds(cos, 1.0)
    temps = {h: 1.0 if h == "cosine" else match_confidence(head_logits(score_fn(Q, h), h), target) for h in heads}
    return {"temperatures": temps, "method": "text",
            "rule": "each head's mean log-odds of its top class on the text queries equals the cosine head's "
                    "at logit scale 100", "queries": int(Q.shape[0]), "cosine_mean_log_odds": target,
            "cosine_mean_max_prob": float(softmax(cos, 1.0).max(dim=1).values.mean())}


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


def choose_kernel_logits(loo_scores, labels, fallback: float, signed_votes: bool = True, prior=None,
                         config: Optional[AdaptConfig] = None) -> dict:
    """The kernel head's kind of logits and T by the lowest held-out NLL (ties: log, score, floored), "log" charged
    for the true-class votes ≤ 0 new images may have (their rate's :func:`event_rate_bound` at ``config.level``),
    "floored" (with a ``prior``) at its best ε of ``config.kernel_floors``; "log" where a kind has no finite T."""
    y, cfg = np.asarray(labels), config_or_default(config)
    s = torch.as_tensor(loo_scores, dtype=torch.float64)
    vote_not_positive = s[torch.arange(len(y)), torch.as_tensor(y, dtype=torch.long)] <= 0   # where log puts p ≈ 0
    z = {kind: kernel_logits(s, kind) for kind in ("log", "score")}
    eps = {f"floored {e:g}": e for e in cfg.kernel_floors} if prior is not None else {}
    zf = {k: floored_log(loo_scores, prior, e) for k, e in eps.items()}
    fit = loo_temperatures({**z, **zf}, y, fallback={k: fallback for k in [*z, *eps]})
    entry = lambda k: {"temperature": fit["temperatures"][k], **fit["loo"][k], **(  # noqa: E731
        {} if fit["loo"][k]["fitted"] else dict.fromkeys(("temperature", "nll", "ece")))}
    cand, floor = {k: entry(k) for k in z}, None
    if eps:
        fitted = [k for k in eps if fit["loo"][k]["fitted"]]
        best = min(fitted, key=lambda k: (fit["loo"][k]["nll"], eps[k])) if fitted else list(eps)[-1]
        z["floored"], floor = zf[best], eps[best]
        cand["floored"] = {**entry(best), "floor": floor, "by_floor": {f"{e:g}": fit["loo"][k]["nll"] for k, e in eps.items()}}
    diff = guard = None
    if all(c["fitted"] for c in cand.values()):
        d = example_nll(z["score"], cand["score"]["temperature"], y) - example_nll(z["log"], cand["log"]["temperature"], y)
        diff = {"mean": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None}
        seen = int(vote_not_positive.sum())
        bound = event_rate_bound(seen, len(y), cfg.level) if signed_votes else 0.0   # rate of true votes ≤ 0 ...
        loss = float(torch.quantile(z["log"].max(dim=1).values - math.log(KERNEL_LOG_FLOOR), 0.5)) / float(
            cand["log"]["temperature"])                                           # ... × what log loses on each
        guard = {"seen": seen, "rate_bound": bound, "loss": loss, "charge": max(bound - seen / max(len(y), 1), 0.0) * loss}
        charged = {"log": cand["log"]["nll"] + guard["charge"], "score": cand["score"]["nll"],
                   **({"floored": cand["floored"]["nll"]} if "floored" in cand else {})}
        kind = min(charged, key=lambda k: (charged[k], list(charged).index(k)))
        reason = (f"leave-one-out NLL on the shots: score {cand['score']['nll']:.4g}, log {cand['log']['nll']:.4g} "
                  f"+ {guard['charge']:.4g} for true-class votes ≤ 0 on new images (up to {bound:.3g} of them "
                  f"at {loss:.4g} each; {seen} of {len(y)} shots showed one)"
                  + (f", floored (ε = {floor:g}) {cand['floored']['nll']:.4g}" if "floored" in cand else ""))
        T, loo = cand[kind]["temperature"], {k: v for k, v in cand[kind].items()
                                             if k not in ("temperature", "floor", "by_floor")}
    else:
        kind, T, loo = "log", fit["temperatures"]["log"], fit["loo"]["log"]
        reason = ("under at least one kind every shot is ranked first when left out: its NLL has no finite minimiser, so the "
                  "kinds cannot be compared; log" + ("" if loo["fitted"] else " with the text rule's T"))
    return {"kind": kind, "temperature": T, "floor": floor if kind == "floored" else None, "loo": loo, "candidates": cand,
            "nll_score_minus_log": diff, "loo_true_vote_not_positive": float(vote_not_positive.double().mean()),
            "log_tail_guard": guard, "reason": reason}


def event_rate_bound(k: int, n: int, level: float) -> float:
    """Wilson score upper bound: the rate p with ``k/n = p − level·√(p(1 − p)/n)`` (k = 0, level 1: 1/(n + 1))."""
    if n <= 0 or k >= n:
        return 1.0
    r, z2 = k / n, level * level / n
    return min((r + z2 / 2 + level * math.sqrt(r * (1 - r) / n + z2 / (4 * n))) / (1 + z2), 1.0)


def example_nll(logits, temperature: float, labels) -> np.ndarray:
    """``−log softmax(z_i / T)_{y_i}`` per example, in log space (exact where p would underflow)."""
    z = torch.as_tensor(logits, dtype=torch.float64) / float(temperature)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    return (-torch.log_softmax(z, dim=1)[torch.arange(z.shape[0]), y]).numpy()


def nll_from_logits(logits, temperature: float, labels) -> float:
    return float(example_nll(logits, temperature, labels).mean())


def confidence_bins(conf, correct, n_bins: int = ECE_BINS):
    """Per bin ``(b/B, (b+1)/B]`` of top-1 confidence (the first takes 0 too): count, summed confidence and hits."""
    idx = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    return tuple(np.bincount(idx, weights=w, minlength=n_bins) for w in (None, conf, correct))


def ece_of(conf, correct, n_bins: int = ECE_BINS) -> float:
    """``Σ_b n_b/N · |acc_b − conf_b|`` of top-1 confidences and their correctness (per image)."""
    count, conf_sum, hits = confidence_bins(np.asarray(conf, np.float64), np.asarray(correct, np.float64), n_bins)
    u = count > 0
    return float((count[u] / count.sum() * np.abs(hits[u] / count[u] - conf_sum[u] / count[u])).sum())


def ece(probs, labels, n_bins: int = ECE_BINS) -> float:
    """:func:`ece_of` of N×C probabilities (numpy or torch) against class indices."""
    p = np.asarray(probs.detach().cpu().numpy() if hasattr(probs, "detach") else probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise SvgenError(f"probabilities must be N×C with N labels, got {p.shape} and {y.shape}")
    return ece_of(p.max(axis=1), p.argmax(axis=1) == y, n_bins)


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
    shotless = torch.as_tensor(shotless, dtype=torch.bool, device=p.device)
    q = p * torch.ones(p.shape[1], dtype=p.dtype, device=p.device).masked_fill(shotless, math.exp(delta))
    return q / q.sum(dim=1, keepdim=True)


def head_of_weight(w: float) -> str:
    return "kernel" if w == 1.0 else "linear" if w == 0.0 else MIXTURE


def check_weight(w, where: str = "mixture_weight") -> float:
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or not 0.0 <= w <= 1.0:
        raise SvgenError(f"{where} must be a number in [0, 1], got {w!r}")
    return float(w)
