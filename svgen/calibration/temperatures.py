"""Probabilities from every head: per-head temperatures, chosen without images, and how to judge them.

Each head's probabilities are a softmax of its *logits* divided by a temperature T:

    p(c | x) = softmax(z(x) / T)_c

* cosine: ``z = 100 · x̂ p̂ᵀ`` (CLIP's logit scale 100) and T = 1 — open_clip's
  ``(100 * image_features @ text_features.T).softmax(dim=-1)``, exactly;
* linear: ``z = x̂ Wᵀ + b``;
* kernel vote, one of two kinds of logits, recorded per artifact (``kernel_logits`` in svgen.json,
  and in every export):

  - ``"log"`` (the default, and what every artifact written before the choice existed means):
    ``z = log max(score, ε)``. With vote weights scaled by M·λ a score is about the summed kernel
    mass of the class's own support vectors (a Parzen density up to a constant), so
    ``softmax(log score / T) ∝ score^(1/T)`` is the normalised mass, sharpened. Softmax of the raw
    scores would be almost flat on images: they sit far from every support vector, where all
    classes' masses are alike (measured in docs/calibration.md). ``log`` makes the kernel's logits
    move linearly with cosine, as the other heads' do, so a temperature set on text carries over
    to images; ε (:data:`KERNEL_LOG_FLOOR`) only matters for votes that are not positive, which
    get probability ≈ 0 at any temperature.
  - ``"score"``: ``z = score``, the raw vote. With labelled shots the vote is a kernel ridge fit to
    one-hot labels, not a mass: an image whose true class gets a vote ≤ 0 would get p ≈ 0 under
    ``"log"`` (mean NLLs of 10–160 on the CoOp validation sets), while a softmax of the votes
    themselves degrades smoothly with the vote gap.

  The kind is chosen only where the kernel head's temperature is fitted on labelled shots
  (:func:`choose_kernel_logits`: T fitted for both kinds on the same leave-one-out scores, the
  lower LOO NLL wins, with ``"log"`` charged for the true-class votes ≤ 0 that new images may have:
  its loss there is unbounded, and shots tighter than the images never show one — an upper
  bound of their rate × that loss, :func:`log_tail_guard`). The text rule and its fallbacks give ``"log"`` (matched
  on log scores; without labels nothing measures which kind fits better); a kept zero-shot pool ``"score"`` (the
  scores are its posterior's prior, :func:`svgen.transductive.adapt._adopt_posterior`). Measured on the CoOp sets
  (docs/calibration.md, dev data, one seed): without the charge the LOO rule kept ``"log"`` in every
  run with stand-in prototypes that are the shots' class means (no left-out shot's own class gets a
  vote ≤ 0 — means of augmented views, inside their own prototype — while up to 23% of the
  validation images' do); with it raw votes are chosen in 9 of 10 runs at 4 and 16 shots and the
  kernel head's mean validation NLL falls from 24.4 to 1.02 at 16 shots (ECE 0.141 → 0.084). With
  leak-free stand-ins (the other train16 images) raw votes are chosen at 1 and 4 shots, mean
  validation NLL 1.35 → 0.97 and 1.58 → 0.99 (ECE 0.064 → 0.038, 0.099 → 0.038).

**Without images** (:func:`text_temperatures`): the text embeddings of the classes (each
prompt's embedding ``E[c, t]``; a seeded sample for many classes, :func:`query_rows`) are scored
as queries by every head. The cosine head at logit scale 100 has a mean log-odds of its top class
``m = mean log(p_max / (1 − p_max))`` on them; each other head's T is the one that gives the same
mean log-odds (:func:`match_confidence`; it falls monotonically with T, so bisection finds it;
log-odds, not p_max, because on text the cosine head is often certain to many decimals). So no
head is more confident than CLIP's own rule on the same prototypes. No image, labelled or not,
is used.

**With labelled images** (``adapt(X, y)``): the kernel and linear heads' T minimise the negative
log-likelihood of the shots' exact leave-one-out logits (:func:`fit_temperature`, convex in 1/T;
:func:`svgen.fewshot.residual` gives the kernel head's held-out fold scores — with one shot per class its exact
leave-one-out scores — and :func:`svgen.fewshot.loo.lda_loo_logits` the LDA head's, so no shot's score has seen its own label); :func:`loo_temperatures` records what it gave. The cosine
head keeps CLIP's scale; the kernel head's kind of logits is chosen on the same LOO scores
(:func:`choose_kernel_logits`). Shots that are all ranked first when left out give no finite
temperature; the head then keeps the text rule's (and ``"log"``). Caveat: when the shots are tighter than the
images to classify (e.g. means of augmented views), their LOO logits are too separable and the
fitted T too low. Any other labelled logits can be used the same way:
``clf.set_temperatures({head: fit_temperature(z_loo, y)}, method="loo-nll")``.

**Judging them**: :func:`nll` (mean −log p of the true class, ``sklearn.metrics.log_loss``), :func:`ece` (15 equal-width
confidence bins, ``Σ_b n_b/N · |acc_b − conf_b|``; :func:`ece_of` from top-1 confidences) and :func:`reliability`."""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np
import torch

from svgen.core.roots import bisect
from svgen.errors import SvgenError
from svgen.selection import AdaptConfig, config_or_default

KERNEL_LOG_FLOOR = 1e-30
ECE_BINS = 15
T_RANGE = (1e-8, 1e8)   # a fitted T, clipped (:func:`in_range`): the artifact's TEMPERATURE_RANGE (e^30 was unloadable)
LOG_T_RANGE = (math.log(T_RANGE[0]), math.log(T_RANGE[1]))   # bisection bracket for log T
in_range = lambda T: min(max(T, T_RANGE[0]), T_RANGE[1])     # noqa: E731  (exp(log 1e8) is a hair above 1e8)


KERNEL_LOGITS = ("log", "score", "floored")   # kinds of kernel-vote logits; the first is the default
TEXT_RULE_KERNEL_LOGITS = ("the text rule: its temperature matches log scores on the text queries, and without "
                           "labels nothing measures whether raw votes fit better")


def check_kernel_logits(kind, where: str = "kernel_logits") -> str:
    """``kind`` if it is one of :data:`KERNEL_LOGITS`, else one :class:`SvgenError` line."""
    if not isinstance(kind, str) or kind not in KERNEL_LOGITS:
        raise SvgenError(f"{where} must be {' or '.join(map(repr, KERNEL_LOGITS))}, got {kind!r}")
    return kind


def floored_log(scores, prior, floor: float) -> torch.Tensor:
    """``log max(s_c, ε·p₀_c·max_j s_j / max_j p₀_j)`` row by row (and at least ``log 10⁻³⁰``): the ``"floored"`` kind
    of an adapted kernel head's logits (scores ``s = p₀ + k(x̂, X)V``, ``prior`` its zero-shot term ``p₀``). A class the
    shots' correction pushed to ≤ 0 keeps a fraction of its zero-shot probability instead of ``10⁻³⁰``; with
    ``ε < 1`` no floor reaches the row's top score, so the argmax is the scores' exactly."""
    s = torch.as_tensor(scores, dtype=torch.float64)
    p = torch.as_tensor(prior, dtype=torch.float64)
    f = float(floor) * p * (s.max(dim=1, keepdim=True).values / p.max(dim=1, keepdim=True).values.clamp_min(1e-300))
    return torch.maximum(s, f).clamp_min(KERNEL_LOG_FLOOR).log()


def check_floor(floor) -> float:
    if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0 < floor < 1):
        raise SvgenError(f"kernel_floor must be a number in (0, 1), got {floor!r}")
    return float(floor)


def kernel_logits(scores, kind: str = "log", prior=None, floor: Optional[float] = None) -> torch.Tensor:
    """The kernel vote's logits: ``log max(score, 10⁻³⁰)`` (``"log"``), the score itself (``"score"``), or
    :func:`floored_log` (``"floored"``: needs the head's zero-shot ``prior`` term and its ``floor`` ε)."""
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
    """The logits a head's probabilities are a softmax of: :func:`kernel_logits` of the kind
    ``kernel_kind`` for the kernel vote, the scores themselves for the linear and cosine heads."""
    if head == "kernel":
        return kernel_logits(scores, kernel_kind, prior, floor)
    return torch.as_tensor(scores)


def softmax(logits, temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` row-wise (float64 inside, so small temperatures do not overflow)."""
    if not temperature > 0:
        raise SvgenError(f"temperature must be positive, got {temperature}")
    z = torch.as_tensor(logits, dtype=torch.float64) / float(temperature)
    return torch.softmax(z, dim=1)


def mean_max_prob(logits, temperature: float) -> float:
    return float(softmax(logits, temperature).max(dim=1).values.mean())


def mean_log_odds(logits, temperature: float) -> float:
    """Mean log-odds of the top class, ``mean_i log(p_max / (1 − p_max))`` of ``softmax(z_i / T)``,
    computed as ``z_max/T − logsumexp_{j≠max}(z_j/T)`` (finite where p_max rounds to 1)."""
    z = torch.as_tensor(logits, dtype=torch.float64) / float(temperature)
    top = z.max(dim=1)
    rest = z.scatter(1, top.indices[:, None], -math.inf)
    return float((top.values - torch.logsumexp(rest, dim=1)).mean())


def match_confidence(logits, target: float, iters: int = 60) -> float:
    """The temperature T at which the mean log-odds of the top class (:func:`mean_log_odds`) of
    ``softmax(logits / T)`` equals ``target``, by bisection on log T.

    Each row's log-odds ``−log Σ_{j≠max} exp((z_j − z_max)/T)`` falls monotonically with T, so the mean does too.
    Log-odds rather than the max-probability itself: on text queries the cosine head is often all but certain (p_max =
    1 − 10⁻⁹), where probabilities cannot tell temperatures apart but log-odds still can. A target outside the
    reachable range gives the bracket's end; logits that all tie (one name twice), which no T changes, give 1."""
    top = (z := torch.as_tensor(logits, dtype=torch.float64)).max(dim=1)
    gap = (z - top.values[:, None]).scatter(1, top.indices[:, None], -math.inf)  # z_j − z_max, j ≠ max
    if not bool((gap[torch.isfinite(gap)] < 0).any()):
        return 1.0
    return in_range(math.exp(bisect(lambda m: float((-torch.logsumexp(gap / math.exp(m), dim=1)).mean()) > target,
                                    *LOG_T_RANGE, iters, tol=1e-10)))  # mean_log_odds at T = e^m; T to 1e-10 relative


def fit_temperature(logits_loo, labels, iters: int = 100) -> float:
    """T minimising the mean negative log-likelihood ``−mean_i log softmax(z_i / T)_{y_i}``.

    ``logits_loo``: N×C logits of labelled examples, each computed without that example (leave-one-out)
    so the temperature is not fit to scores that have seen their own label. NLL is convex in β = 1/T
    with derivative ``mean_i (E_p[z_i] − z_{i,y_i})``, increasing in β; bisection finds its zero.
    When the data never prefer a finite β (every example already ranked first, or none), the bracket's end is
    returned."""
    z = torch.as_tensor(logits_loo, dtype=torch.float64)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    if z.dim() != 2 or y.shape != (z.shape[0],) or z.shape[0] == 0:
        raise SvgenError(f"fit_temperature needs N×C logits and N labels, got {tuple(z.shape)} and {tuple(y.shape)}")
    z_true = z[torch.arange(z.shape[0]), y]

    def slope(log_beta):
        p = torch.softmax(z * math.exp(log_beta), dim=1)
        return float(((p * z).sum(dim=1) - z_true).mean())

    return in_range(math.exp(-bisect(lambda log_beta: slope(log_beta) < 0, -LOG_T_RANGE[1], -LOG_T_RANGE[0], iters)))


def query_rows(per_template: torch.Tensor, seed: int = 0, config: Optional[AdaptConfig] = None) -> torch.Tensor:
    """The text queries: every prompt embedding ``E[c, t]`` (C·T×D), or a seeded sample of at most
    ``config.max_queries`` — fewer for many classes, so a query's N×C logits stay about
    ``config.max_logits`` numbers (256 queries at least: the mean max-probability is an average)."""
    cfg = config_or_default(config)
    Q = per_template.reshape(-1, per_template.shape[-1])
    max_queries = min(cfg.max_queries, max(256, cfg.max_logits // per_template.shape[0]))
    if Q.shape[0] > max_queries:
        g = torch.Generator().manual_seed(seed)
        Q = Q[torch.randperm(Q.shape[0], generator=g)[:max_queries].sort().values]
    return Q


def text_temperatures(score_fn, per_template: torch.Tensor, heads=("kernel", "linear", "cosine"),
                      config: Optional[AdaptConfig] = None) -> dict:
    """Temperatures from the text side (see module docstring): ``{"temperatures": {head: T}, ...}``.

    ``score_fn(Q, head)`` gives a head's N×C scores for query rows Q. Returns the temperatures and
    what they were matched to, for ``svgen.json``.
    """
    Q = query_rows(per_template, config=config)
    cos = head_logits(score_fn(Q, "cosine"), "cosine")
    target = mean_log_odds(cos, 1.0)
    temps = {}
    for head in heads:
        temps[head] = 1.0 if head == "cosine" else match_confidence(head_logits(score_fn(Q, head), head), target)
    return {"temperatures": temps, "method": "text",
            "rule": "each head's mean log-odds of its top class on the text queries equals the cosine head's "
                    "at logit scale 100",
            "queries": int(Q.shape[0]), "cosine_mean_log_odds": target, "cosine_mean_max_prob": mean_max_prob(cos, 1.0)}


# ----------------------------------------------------------------------------- with labelled shots

def loo_temperatures(loo_logits: Dict[str, torch.Tensor], labels, fallback: Dict[str, float]) -> dict:
    """Per-head T by :func:`fit_temperature` on leave-one-out logits of the shots, and what it gives
    there: ``{"temperatures": {head: T}, "loo": {head: {"nll", "ece", "acc1", "fitted"}}}`` (LOO, at that T).

    When every shot is ranked first when left out, the NLL falls all the way to T → 0 (certainty): the
    shots give no finite temperature and the head keeps ``fallback[head]`` (the text rule's), ``fitted``
    False."""
    y = np.asarray(labels)
    temps, loo = {}, {}
    for head, z in loo_logits.items():
        z = torch.as_tensor(z, dtype=torch.float64)
        acc = float((z.argmax(dim=1).numpy() == y).mean())
        fitted = acc < 1.0
        T = fit_temperature(z, y) if fitted else float(fallback[head])
        temps[head] = T
        loo[head] = {**calibration_metrics(z, T, y), "acc1": acc, "fitted": fitted}
    return {"temperatures": temps, "loo": loo}


def choose_kernel_logits(loo_scores, labels, fallback: float, signed_votes: bool = True, prior=None,
                         config: Optional[AdaptConfig] = None) -> dict:
    """The kernel head's kind of logits (:data:`KERNEL_LOGITS`) and temperature from the shots' exact
    held-out scores (N×C: :mod:`svgen.fewshot.residual`'s fold scores, or its leave-one-out scores with one shot per class).

    T is fitted by :func:`fit_temperature` for each kind on the same LOO scores and the kind with the
    lower *guarded* LOO NLL is kept (a tie keeps ``"log"``). The guard: ``"log"`` puts p ≈ ε on the true
    class of any image whose true-class vote is ≤ 0 — a loss of about ``(z_top − log ε)/T`` (≈ 70/T), unbounded
    as ε → 0 — while raw votes lose a bounded amount. k of n shots showing that event does not bound how
    often new images will: the rate's upper bound at ``config.level`` standard errors (:func:`event_rate_bound`,
    Wilson; 1/(n + 1) when k = 0 at level 1) is charged at that loss on top of the log kind's
    LOO NLL (which already counts the k it saw). Shots that are tighter than the images to classify (means of
    augmented views; stand-in prototypes that contain them) never show the event, so the plain LOO NLL
    alone would keep ``"log"`` exactly where its tail matters most. With ``signed_votes`` False (no vote
    weight is negative, so no vote can be ≤ 0) there is nothing to charge. When either kind gives no finite T (every shot ranked
    first when left out) the NLLs cannot be compared: ``"log"``, with its fitted T or else ``fallback``
    (the text rule's T).
    With the head's zero-shot ``prior`` term at the same shots (an adapted kernel head, ``s = p₀ + k(x̂, X)V``) a third
    kind competes, ``"floored"`` (:func:`floored_log`), with its ε from ``config.kernel_floors`` by the same held-out
    NLL; its floor bounds what a true-class vote ≤ 0 costs by the zero-shot probability, so it is not charged.
    Returns ``{"kind", "temperature", "floor" (ε, or None), "loo": {nll, ece, acc1, fitted} of the kept kind, "candidates":
    {kind: {temperature, nll, ece, acc1, fitted}}, "nll_score_minus_log": {"mean", "se"},
    "loo_true_vote_not_positive", "reason"}`` (the NLL difference per shot, paired, with its standard
    error, ``None`` when not both were fitted; the share of shots whose own class gets a LOO vote ≤ 0,
    where ``"log"`` puts p ≈ 0).
    """
    y, cfg = np.asarray(labels), config_or_default(config)
    floors_grid = cfg.kernel_floors
    plain = ("log", "score")
    z = {kind: kernel_logits(torch.as_tensor(loo_scores, dtype=torch.float64), kind) for kind in plain}
    floors = {}
    if prior is not None:   # "floored", one candidate per ε: the best of them by its own held-out NLL
        floors = {eps: floored_log(loo_scores, prior, eps) for eps in floors_grid}
    fit = loo_temperatures({**z, **{f"floored {e:g}": v for e, v in floors.items()}}, y,
                           fallback={k: fallback for k in [*plain, *(f"floored {e:g}" for e in floors)]})
    entry = lambda k: ({"temperature": fit["temperatures"][k], **fit["loo"][k]} if fit["loo"][k]["fitted"]  # noqa: E731
                       else {"temperature": None, "nll": None, "ece": None, "acc1": fit["loo"][k]["acc1"],
                             "fitted": False})
    cand = {kind: entry(kind) for kind in plain}
    floor = None
    if floors:
        fitted = [e for e in floors if fit["loo"][f"floored {e:g}"]["fitted"]]
        floor = min(fitted, key=lambda e: (fit["loo"][f"floored {e:g}"]["nll"], e)) if fitted else floors_grid[-1]
        cand["floored"] = {**entry(f"floored {floor:g}"), "floor": floor,
                           "by_floor": {f"{e:g}": fit["loo"][f"floored {e:g}"]["nll"] for e in floors}}
        z["floored"] = floors[floor]
    diff = guard = None
    if all(c["fitted"] for c in cand.values()):
        d = (example_nll(z["score"], cand["score"]["temperature"], y)
             - example_nll(z["log"], cand["log"]["temperature"], y))
        diff = {"mean": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None}
        guard = log_tail_guard(z["log"], loo_scores, y, cand["log"]["temperature"], signed_votes, cfg.level)
        charged = {"log": cand["log"]["nll"] + guard["charge"], "score": cand["score"]["nll"],
                   **({"floored": cand["floored"]["nll"]} if "floored" in cand else {})}
        kind = min(charged, key=lambda k: (charged[k], list(charged).index(k)))   # ties: log, score, floored
        reason = (f"leave-one-out NLL on the shots: score {cand['score']['nll']:.4g}, log {cand['log']['nll']:.4g} "
                  f"+ {guard['charge']:.4g} for true-class votes ≤ 0 on new images (up to {guard['rate_bound']:.3g} of them "
                  f"at {guard['loss']:.4g} each; {guard['seen']} of {len(y)} shots showed one)"
                  + (f", floored (ε = {floor:g}) {cand['floored']['nll']:.4g}" if "floored" in cand else ""))
        T, loo = cand[kind]["temperature"], {k: v for k, v in cand[kind].items()
                                             if k not in ("temperature", "floor", "by_floor")}
    else:
        kind, T, loo = "log", fit["temperatures"]["log"], fit["loo"]["log"]
        reason = ("under at least one kind every shot is ranked first when left out: its NLL has no finite minimiser, so the "
                  "kinds cannot be compared; log" + ("" if loo["fitted"] else " with the text rule's T"))
    s = z["score"]
    not_positive = float((s[torch.arange(len(y)), torch.as_tensor(y, dtype=torch.long)] <= 0).double().mean())
    return {"kind": kind, "temperature": T, "floor": floor if kind == "floored" else None, "loo": loo,
            "candidates": cand, "nll_score_minus_log": diff, "loo_true_vote_not_positive": not_positive,
            "log_tail_guard": guard, "reason": reason}


def event_rate_bound(k: int, n: int, level: float) -> float:
    """Upper bound of a rate seen k times in n trials at ``level`` standard errors (Wilson score): the p at which
    ``k/n = p − level·√(p(1 − p)/n)``; k = 0 at level 1 gives ``1/(n + 1)``."""
    if n <= 0 or k >= n:
        return 1.0
    r, z2 = k / n, level * level / n
    return min((r + z2 / 2 + level * math.sqrt(r * (1 - r) / n + z2 / (4 * n))) / (1 + z2), 1.0)


def log_tail_guard(z_log, scores, labels, temperature: float, signed_votes: bool = True,
                   level: Optional[float] = None) -> dict:
    """What the ``"log"`` kind may lose on new images whose true-class vote is ≤ 0 (:func:`choose_kernel_logits`).

    ``seen``: shots whose LOO true-class vote is ≤ 0; ``rate_bound``: :func:`event_rate_bound` of that;
    ``loss``: the median over shots of ``(max_c z_c − log ε)/T`` (what such an image costs, its true logit at
    the floor); ``charge = (rate_bound − seen/n)·loss`` (the seen ones are in the LOO NLL already), 0 when the
    vote weights are not ``signed_votes`` (every vote is then positive)."""
    z = torch.as_tensor(z_log, dtype=torch.float64)
    s = torch.as_tensor(scores, dtype=torch.float64)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    n = int(y.numel())
    seen = int((s[torch.arange(n), y] <= 0).sum())
    level = config_or_default(None).level if level is None else level
    bound = event_rate_bound(seen, n, level) if signed_votes else 0.0
    loss = float(torch.quantile(z.max(dim=1).values - math.log(KERNEL_LOG_FLOOR), 0.5)) / float(temperature)
    return {"seen": seen, "rate_bound": bound, "loss": loss, "charge": max(bound - seen / max(n, 1), 0.0) * loss}


# ----------------------------------------------------------------------------- judging probabilities

def _probs_labels(probs, labels):
    p = np.asarray(probs.detach().cpu().numpy() if hasattr(probs, "detach") else probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise SvgenError(f"probabilities must be N×C with N labels, got {p.shape} and {y.shape}")
    return p, y


def nll(probs, labels, eps: float = 1e-15) -> float:
    """Mean negative log-likelihood of the true class, ``−mean_i log p_{i,y_i}`` (p clipped to [eps, 1])."""
    p, y = _probs_labels(probs, labels)
    return float(-np.log(np.clip(p[np.arange(len(y)), y], eps, 1.0)).mean())


def example_nll(logits, temperature: float, labels) -> np.ndarray:
    """``−log softmax(z_i / T)_{y_i}`` per example, computed in log space (exact where p would underflow)."""
    z = torch.as_tensor(logits, dtype=torch.float64) / float(temperature)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    return (-torch.log_softmax(z, dim=1)[torch.arange(z.shape[0]), y]).numpy()


def nll_from_logits(logits, temperature: float, labels) -> float:
    """``−mean_i log softmax(z_i / T)_{y_i}`` (:func:`example_nll` averaged)."""
    return float(example_nll(logits, temperature, labels).mean())


def reliability(probs, labels, n_bins: int = ECE_BINS) -> dict:
    """Confidence (max-probability) bins ``(b/B, (b+1)/B]``: count, mean confidence and accuracy per bin."""
    p, y = _probs_labels(probs, labels)
    return reliability_of(p.max(axis=1), p.argmax(axis=1) == y, n_bins)


def reliability_of(conf, correct, n_bins: int = ECE_BINS) -> dict:
    """:func:`reliability` of top-1 confidences ``conf`` and their correctness ``correct`` (per image)."""
    conf, correct = np.asarray(conf, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    # bin b holds b/B < conf ≤ (b+1)/B (conf > 0 always; the first bin also takes conf = 0)
    idx = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=n_bins) / count
        accuracy = np.bincount(idx, weights=correct, minlength=n_bins) / count
    return {"edges": np.linspace(0, 1, n_bins + 1), "count": count, "confidence": mean_conf, "accuracy": accuracy}


def ece(probs, labels, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error ``Σ_b (n_b / N) · |acc_b − conf_b|`` over equal-width confidence bins."""
    p, y = _probs_labels(probs, labels)
    return ece_of(p.max(axis=1), p.argmax(axis=1) == y, n_bins)


def ece_of(conf, correct, n_bins: int = ECE_BINS) -> float:
    """:func:`ece` of top-1 confidences and their correctness (per image), e.g. pooled over several fits."""
    r = reliability_of(conf, correct, n_bins)
    n = r["count"].sum()
    used = r["count"] > 0
    return float((r["count"][used] / n * np.abs(r["accuracy"][used] - r["confidence"][used])).sum())


def calibration_metrics(logits, temperature: float, labels, n_bins: int = ECE_BINS) -> Dict[str, float]:
    """``{"nll", "ece"}`` of ``softmax(logits / T)`` against class indices."""
    return {"nll": nll_from_logits(logits, temperature, labels),
            "ece": ece(softmax(logits, temperature), labels, n_bins)}
