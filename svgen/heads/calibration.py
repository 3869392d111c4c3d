"""Probabilities from every head: ``p = softmax(z / T)``, each head's temperature from the text side, the
``"mixture"`` head ``w·p_kernel + (1 − w)·p_linear`` (each head at its own T) and its tilt of the classes without
shots, the NLL / ECE of probabilities, and a pool's label-free scales and their NLL guard. Temperatures from
held-out shots: :mod:`svgen.adapt.temperatures`; docs/calibration.md and docs/transductive.md state the rules."""

from __future__ import annotations

import math

import numpy as np
import torch

from svgen.adapt.config import AdaptConfig
from svgen.core.logits import head_logits
from svgen.core.roots import bisect
from svgen.errors import SvgenError

ECE_BINS = 15
T_RANGE = (1e-8, 1e8)   # a fitted T, clipped (:func:`in_range`): the artifact's TEMPERATURE_RANGE (e^30 was unloadable)
LOG_T_RANGE = (math.log(T_RANGE[0]), math.log(T_RANGE[1]))   # bisection bracket for log T
in_range = lambda T: min(max(T, T_RANGE[0]), T_RANGE[1])     # noqa: E731  (exp(log 1e8) is a hair above 1e8)
MIXTURE = "mixture"   # the head with labelled shots: w·p_kernel + (1 − w)·p_linear
PROB_FLOOR = 1e-300   # a true-class probability of 0 in both heads: the NLL stays finite


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


def query_rows(per_template: torch.Tensor, config: AdaptConfig, seed: int = 0) -> torch.Tensor:
    """Every prompt embedding (C·T×D), or a seeded sorted sample of ``config.max_queries`` (fewer where C × them
    passes ``config.max_logits``; 256 at least)."""
    Q = per_template.reshape(-1, per_template.shape[-1])
    max_queries = min(config.max_queries, max(256, config.max_logits // per_template.shape[0]))
    if Q.shape[0] > max_queries:
        Q = Q[torch.randperm(Q.shape[0], generator=torch.Generator().manual_seed(seed))[:max_queries].sort().values]
    return Q


def text_temperatures(score_fn, per_template: torch.Tensor, config: AdaptConfig,
                      heads=("kernel", "linear", "cosine")) -> dict:
    """Each head's T such that its mean top-class log-odds on the text queries equals the cosine head's at scale
    100 (``score_fn(Q, head)``: N×C scores). ``{"temperatures": {head: T}, ...}`` for ``svgen.json``."""
    Q = query_rows(per_template, config)
    cos = head_logits(score_fn(Q, "cosine"), "cosine")
    target = mean_log_odds(cos, 1.0)
    temps = {h: 1.0 if h == "cosine" else match_confidence(head_logits(score_fn(Q, h), h), target) for h in heads}
    return {"temperatures": temps, "method": "text",
            "rule": "each head's mean log-odds of its top class on the text queries equals the cosine head's "
                    "at logit scale 100", "queries": int(Q.shape[0]), "cosine_mean_log_odds": target,
            "cosine_mean_max_prob": float(softmax(cos, 1.0).max(dim=1).values.mean())}


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


# A pool without labels: the scale t (a multiplier, not a temperature) of softmax(t·scores) that matches a target
# on at most CALIBRATION_ROWS evenly spaced rows, and the NLL guard on it (docs/transductive.md).
CALIBRATION_ROWS = 2048


def entropy(logits: torch.Tensor) -> float:
    """The mean entropy of ``softmax(logits)`` over the rows."""
    lp = torch.log_softmax(logits, dim=1)
    return float(-(lp.exp() * lp).sum(dim=1).mean())


def calibration_rows(n: int) -> torch.Tensor:
    return torch.linspace(0, n - 1, min(n, CALIBRATION_ROWS)).round().long()


def _scale(s: torch.Tensor, too_flat, iters: int) -> float:
    """The scale t (bisection on log t) where ``too_flat(t·s)`` turns False, s row-centred."""
    s = s - s.mean(dim=1, keepdim=True)
    spread = float(s.abs().max())
    if spread == 0 or not math.isfinite(spread):
        return 1.0
    lo, hi = math.log(1e-3 / spread), math.log(1e4 / spread)
    if too_flat(s * math.exp(hi)):
        return math.exp(hi)
    return math.exp(bisect(lambda m: too_flat(s * math.exp(m)), lo, hi, iters))


def match_entropy(scores: torch.Tensor, target: float, iters: int = 40) -> float:
    """The scale t giving ``softmax(t·scores)`` mean entropy ``target`` on :func:`calibration_rows`."""
    return _scale(scores[calibration_rows(scores.shape[0])].float(), lambda z: entropy(z) > target, iters)


def match_top1(scores: torch.Tensor, target: float, iters: int = 40) -> float:
    """The scale t giving ``softmax(t·scores)`` mean top-1 probability ``target`` (clipped into (1/C, 1))."""
    s = scores[calibration_rows(scores.shape[0])].double()
    target = min(max(float(target), 1.0 / s.shape[1] + 1e-6), 1.0 - 1e-6)
    return _scale(s, lambda z: float(torch.softmax(z, dim=1).max(dim=1).values.mean()) < target, iters)


def nll_excess(scores: torch.Tensor, t: float, reference_logp: torch.Tensor, trust: float) -> float:
    """Mean expected NLL of ``p = softmax(t·scores)`` minus that of the reference ``q = exp(reference_logp)`` under the
    label estimate ``r = trust·p + (1 − trust)·q``: ``(1 − trust)·KL(q‖p) − trust·KL(p‖q)`` (mean over rows)."""
    lp = torch.log_softmax(t * scores.double(), dim=1)
    lq = reference_logp.double()
    kl_qp = (lq.exp() * (lq - lp)).sum(dim=1)
    kl_pq = (lp.exp() * (lp - lq)).sum(dim=1)
    return float(((1.0 - trust) * kl_qp - trust * kl_pq).mean())


def nll_guard(scores: torch.Tensor, t: float, reference_logp: torch.Tensor, trust: float,
              iters: int = 40) -> tuple:
    """(scale, met): ``t``, or the sharpest scale below it at which :func:`nll_excess` on :func:`calibration_rows` is
    ≤ 0. ``met`` False: not even the flattest scale of the bracket meets it (that scale is returned)."""
    rows = calibration_rows(scores.shape[0])
    s, lq = scores[rows].double(), reference_logp[rows].double()
    s = s - s.mean(dim=1, keepdim=True)
    if nll_excess(s, t, lq, trust) <= 0.0:
        return t, True
    spread = float(s.abs().max())
    lo = min(math.log(1e-3 / spread), math.log(t)) if spread > 0 and math.isfinite(spread) else math.log(t)
    if nll_excess(s, math.exp(lo), lq, trust) > 0.0:
        return math.exp(lo), False
    hi = math.log(t)
    m = bisect(lambda m: nll_excess(s, math.exp(m), lq, trust) <= 0.0, lo, hi, iters)
    return math.exp(m - (hi - lo) / 2 ** (iters + 1)), True   # the bracket's low end: a scale that met it
