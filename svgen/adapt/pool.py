"""A pool added to the inductive heads where held-out evidence keeps it (docs/transductive.md, "The rule")."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from svgen.adapt import gate as pool_gate
from svgen.adapt.config import AdaptConfig
from svgen.adapt.pool_decision import Check, Reason, fallback, refuse
from svgen.adapt.select import Decision
from svgen.adapt.solvers import transduction as td
from svgen.adapt.transduce import PoolFit, Scored, Stage, score, too_small, transduce
from svgen.heads import predictor
from svgen.state import Evidence, Heads, KernelHead, PoolFactor, TextSide
from svgen.steps import Clock

log = logging.getLogger(__name__)


def adapt(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float] = None, progress: bool = False,
          *, config: AdaptConfig) -> PoolFit:
    """The unit pool ``U`` checked (:mod:`~svgen.adapt.gate`) and solved in where kept, else inductive heads."""
    C, N, t0, clock = side.n_classes, U.shape[0], time.perf_counter(), Clock(log)
    scored = score(stage, side, U)   # the inductive default head on the pool, once for every step below
    with_shots = stage.shots is not None and len(stage.shots)
    decision, check = too_small(N, C, config), None
    without = int((stage.shots.counts(C) == 0).sum()) if decision is None and with_shots else 0
    if without:
        decision = refuse(Reason.CLASSES_WITHOUT_SHOTS, f"{without} of the {C} classes have no labelled shots, and "
                          "the check on held-out shots cannot see what a pool does to them")
    if decision is None:
        check = (pool_gate.check_with_shots(stage, side, U, strength, config, progress) if with_shots else
                 pool_gate.check_without_shots(stage, side, U, scored, strength, config, progress))
        clock.lap("pool check (%s) on %d images", check.evidence.value, N)
        decision = check.decision()
    if not decision.kept:
        record = {"pool": N, "fallback": None, "prior_head": stage.default_head, **decision.to_json()}
        return refused(stage, scored, {**record, "wall_time_s": time.perf_counter() - t0}, decision)
    shots = check.evidence is Evidence.SHOTS
    entropy = None if shots else scored.entropy()
    fit = transduce(stage, side, U, scored, config, strength, progress, labels_entropy=entropy)
    if not fit.decision.kept:
        return refused(stage, scored, fit.record, fit.decision)
    fit = (_adopt_factor(stage, side, U, fit, check) if shots else
           _adopt_posterior(stage, side, fit, U, scored, check, config.pool_trust))
    fit.record["wall_time_s"] = time.perf_counter() - t0
    fit.decision = decision
    return fit


def agreement_target(check: Check) -> Optional[float]:
    """The cross-half agreement, k of n images, as (k + 1)/(n + 2) (rule of succession); None: none measured."""
    if check.gate is None or check.evidence is not Evidence.HALVES:
        return None
    a, n = float(check.gate.top1.candidate), int(check.gate.top1.n)
    return (a * n + 1.0) / (n + 2.0) if n else a


def refused(stage: Stage, scored: Scored, record: dict, decision: Decision) -> PoolFit:
    """The inductive heads, with the inductive default head's probabilities as the pool's."""
    log.warning("transductive: %s", fallback(decision))
    return PoolFit(stage.heads, record, scored.proba(), None, decision=decision)


def _adopt_factor(stage: Stage, side: TextSide, U: torch.Tensor, fit: PoolFit, check: Check) -> PoolFit:
    """With shots: each head the check fitted a power for × the pool's likelihood^a; the rest stays inductive."""
    WG, bG = fit.gaussian.weight, fit.gaussian.bias
    powers = {h: float(a) for h, a in check.powers.items() if a > 0}
    ind = stage.heads
    heads = Heads(ind.kernel, ind.linear, ind.calibration,
                  PoolFactor(WG.float(), bG.float(), powers) if powers else None)
    default = stage.default_head
    labels = predictor.proba_in_blocks(heads, side.prototypes, side.config.kernel, U, default)
    record = {**fit.record, "check": check.to_json(), "default_head": default,
              "kernel_head": {"replaced": False, "reason": "with shots a pool multiplies the default and linear heads "
                                                          "by its likelihood; the kernel vote is not re-solved"},
              "pool_factor": {"powers": powers,
                              "rule": "p_head(x) ∝ p_head_inductive(x) · exp(a_head · (x̂ W_Gᵀ + b_G)), the pool's "
                                      "Gaussian class log-likelihood (tensors pool_factor.weight, pool_factor.bias); "
                                      "a_head by the NLL of held-out shots that were pool members"},
              "heads": {h: (f"inductive × pool likelihood^{powers[h]:.4g}" if h in powers else
                            "inductive (with shots a pool changes the default and linear heads only)"
                            if h == "kernel" else "inductive (the held-out shots kept no factor for it: its power is "
                                                  "0, or its own paired check did not pass)")
                        for h in predictor.head_names(heads) if h != "cosine"}}
    return PoolFit(heads, record, labels, Heads(ind.kernel, ind.linear, ind.calibration), fit.prior_linear,
                   default_head=default)


def _guard(heads: Heads, side: TextSide, U_cal: torch.Tensor, target: float, agreement: Optional[float],
           trust: float) -> tuple:
    """(scale, record): an adapted head's scale for its scores z, matched to ``target`` (the agreement, or the
    inductive entropy where none was measured) and then no sharper than the NLL guard allows; the record fills."""
    match, guard = td.match_entropy if agreement is None else td.match_confidence, {}
    with torch.no_grad():
        cosine = torch.log_softmax(predictor.logits(heads, side.prototypes, side.config.kernel, U_cal, "cosine").double()
                                   / predictor.temperature(heads, "cosine"), dim=1)

    def scale(z: torch.Tensor, head: str) -> float:
        t = match(z, target)
        t_safe, met = td.nll_guard(z, t, cosine, trust)
        guard[head] = {"matched_scale": t, "scale": t_safe, "softened": t_safe < t, "met": met}
        if not met:
            log.warning("transductive: no temperature of the %s head expects an NLL on the pool at most the cosine "
                        "head's under the label estimate %g·p + %.3g·p_cosine; it is as flat as allowed",
                        head, trust, 1 - trust)
        return t_safe

    return scale, guard


def _scales(stage: Stage, side: TextSide, fit: PoolFit, U_cal: torch.Tensor, kernel: torch.Tensor, scale) -> tuple:
    """(temperatures, powers, why the kernel head carries no factor): the linear head at its scale; the kernel head
    the posterior with the kernel vote as its prior (``kernel``: the inductive kernel scores), where its votes are
    dense and the prior had weight."""
    P, kind, k, temps, powers = side.prototypes, side.config.kernel, fit.prior_scale, {}, {}
    with torch.no_grad():
        lin = predictor.logits(fit.heads, P, kind, U_cal, "linear").double()
        if bool(torch.isfinite(lin).all()):
            temps["linear"] = 1.0 / scale(lin, "linear")
        if fit.heads.kernel.votes.is_sparse:   # the layout that carries a factor stores dense vote weights only
            return temps, powers, ("its vote weights are sparse (local); the artifact layout that carries a factor "
                                   "needs dense ones")
        if not k > 0:
            return temps, powers, "the transduction gave its prior no weight"
        z = k * kernel.double() + predictor.gaussian_log_likelihood(fit.gaussian.weight, fit.gaussian.bias, U_cal)
        if not bool(torch.isfinite(z).all()):
            return temps, powers, "its posterior's scores are not finite"
        t = scale(z, "kernel")
        temps["kernel"], powers["kernel"] = 1.0 / (t * k), t
    return temps, powers, None


def _adopt_posterior(stage: Stage, side: TextSide, fit: PoolFit, U: torch.Tensor, scored: Scored, check: Check,
                     trust: float) -> PoolFit:
    """Without labels: the linear head the posterior, the kernel head that with the kernel vote as its prior (the
    inductive default head, the kernel head without shots, ``scored`` on the pool)."""
    rows, agreement = td.calibration_rows(U.shape[0]), agreement_target(check)
    target = scored.entropy() if agreement is None else agreement
    scale, guard = _guard(fit.heads, side, U[rows], target, agreement, trust)
    kernel = (scored.scores[rows] if stage.default_head == "kernel" else
              predictor.scores(stage.heads, side.prototypes, side.config.kernel, U[rows], "kernel"))
    temps, powers, why = _scales(stage, side, fit, U[rows], kernel, scale)
    cal = predictor.with_temperatures(fit.heads.calibration, temps,
                                      method="entropy-matched" if agreement is None else "confidence-matched",
                                      rule=_posterior_rule(agreement, trust),
                                      **({"kernel_logits": "score"} if powers else {}))
    kernel, ind = fit.heads.kernel, fit.inductive
    if powers and kernel.labels is None:   # rows one by one (the layout with a factor), shared with the inductive heads
        ss = kernel.support_set()
        kernel = KernelHead(ss.rows, kernel.bandwidth, kernel.votes, ss.labels, ss.source, kernel.prior_scale)
        ind = Heads(kernel, ind.linear, ind.calibration)
    WG, bG = fit.gaussian.weight.float(), fit.gaussian.bias.float()
    heads = Heads(kernel, fit.heads.linear, cal, PoolFactor(WG, bG, powers) if powers else None)
    record = {**fit.record, **_posterior_record(temps, powers, why), "check": check.to_json(), "default_head": "linear",
              "nll_guard": {"trust": trust, "reference": "cosine", "heads": guard, "rule": GUARD_RULE}}
    # the pool's probabilities: the deployed default head's on it (what `adapt` + `classify --probs` gives)
    labels = predictor.proba_in_blocks(heads, side.prototypes, side.config.kernel, U, "linear")
    return PoolFit(heads, record, labels, ind, fit.prior_linear, default_head="linear")


GUARD_RULE = ("each adapted head's scale is the matched one, or the sharpest below it at which (1 − trust)·KL(p_cosine‖"
              "p_head) ≤ trust·KL(p_head‖p_cosine) on the pool: its expected NLL under trust·p_head + (1 − trust)·"
              "p_cosine is not above the cosine head's")


def _posterior_rule(agreement: Optional[float], trust: float) -> str:
    return ("after a pool without labels: T giving each adapted head the inductive default head's mean entropy on "
            "the pool" if agreement is None else
            f"after a pool without labels: T giving each adapted head a mean top-1 probability on the pool of "
            f"{agreement:.4g}, how often a head adapted on one half of the pool predicts the other half's own "
            "posterior class (transductive.check.agreement_pool)") + (
            f"; no sharper than expecting, under the label estimate {trust:g}·p_pool + {1 - trust:.3g}·p_cosine, a "
            "mean NLL on the pool above the cosine head's (transductive.nll_guard)")


def _posterior_record(temps: dict, powers: dict, why: Optional[str]) -> dict:
    factor = ("the transductive posterior with the kernel vote as its prior (the inductive kernel scores at T = "
              f"{temps['kernel']:.4g} × pool likelihood^{powers['kernel']:.4g})") if powers else None
    return {"heads": {"linear": "transductive posterior", "kernel": factor or f"inductive ({why})"},
            "kernel_head": {"replaced": False, "factor": bool(powers),
                            "reason": ("the pool multiplies the kernel vote by its likelihood: the transduction's "
                                       "posterior with the vote as its prior") if powers else why},
            **({"pool_factor": {"powers": powers,
                                "rule": "p_kernel(x) ∝ softmax(s(x)/T) · exp(a · (x̂ W_Gᵀ + b_G)), s the "
                                        "inductive kernel scores, T = 1/(a·β·t_prior): the solve's posterior "
                                        "β·t_prior·s(x) + x̂ W_Gᵀ + b_G at the confidence-matching scale a"}}
               if powers else {})}
