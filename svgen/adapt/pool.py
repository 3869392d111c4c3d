"""A pool added to the inductive heads where held-out evidence keeps it (docs/transductive.md, "The rule")."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from svgen.adapt import gate as pool_gate
from svgen import records
from svgen.adapt.config import AdaptConfig
from svgen.adapt.transduce import PoolFit, Scored, Stage, score, too_small, transduce
from svgen.heads import calibration, predictor
from svgen.state import Check, Decision, Evidence, Heads, KernelHead, PoolFactor, Reason, TextSide, refuse
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
        record = records.refused(N, stage.default_head, decision, wall_time_s=time.perf_counter() - t0)
        return refused(stage, scored, record, decision)
    entropy = None if with_shots else scored.entropy()
    fit = transduce(stage, side, U, scored, config, strength, progress, labels_entropy=entropy)
    if not fit.decision.kept:
        return refused(stage, scored, fit.record, fit.decision)
    heads, inductive, record, default = (_adopt_factor(stage, fit, check) if with_shots else
                                         _adopt_posterior(stage, side, fit, U, scored, check, config.pool_trust))
    labels = predictor.proba_in_blocks(heads, side.prototypes, side.config.kernel, U, default)
    record = {**fit.record, **record, "wall_time_s": time.perf_counter() - t0}
    return PoolFit(heads, record, labels, inductive, fit.prior_linear, decision, default_head=default)


def agreement_target(check: Check) -> Optional[float]:
    """The cross-half agreement, k of n images, as (k + 1)/(n + 2) (rule of succession); None: none measured."""
    if check.gate is None or check.evidence is not Evidence.HALVES:
        return None
    a, n = float(check.gate.top1.candidate), int(check.gate.top1.n)
    return (a * n + 1.0) / (n + 2.0) if n else a


def refused(stage: Stage, scored: Scored, record: dict, decision: Decision) -> PoolFit:
    """The inductive heads, with the inductive default head's probabilities as the pool's."""
    log.warning("transductive: %s", records.fallback(decision))
    return PoolFit(stage.heads, record, scored.proba(), None, decision=decision)


def _adopt_factor(stage: Stage, fit: PoolFit, check: Check) -> tuple:
    """With shots: each head the check fitted a power for × the pool's likelihood^a, the rest inductive; (heads, the
    inductive heads, the record's part, the default head)."""
    powers, ind = {h: float(a) for h, a in check.powers.items() if a > 0}, stage.heads
    WG, bG = fit.gaussian.weight.float(), fit.gaussian.bias.float()
    heads = Heads(ind.kernel, ind.linear, ind.calibration, PoolFactor(WG, bG, powers) if powers else None)
    record = records.pool_factor(check, stage.default_head, powers, predictor.head_names(heads))
    return heads, Heads(ind.kernel, ind.linear, ind.calibration), record, stage.default_head


@torch.no_grad()
def _guard(side: TextSide, fit: PoolFit, U_cal: torch.Tensor, kernel: torch.Tensor, target: float,
           agreement: Optional[float], trust: float) -> tuple:
    """(temperatures, powers, why the kernel head carries no factor, the guard's record): the linear head and, where
    it can, the kernel head (the posterior with the inductive ``kernel`` scores as its prior) at the scale matching
    ``target``, no sharper than the NLL guard allows (docs/transductive.md, "How it is bounded")."""
    P, kind, k, temps, powers, guard = side.prototypes, side.config.kernel, fit.prior_scale, {}, {}, {}
    match = calibration.match_entropy if agreement is None else calibration.match_top1
    cosine = torch.log_softmax(predictor.logits(fit.heads, P, kind, U_cal, "cosine").double()
                               / predictor.temperature(fit.heads, "cosine"), dim=1)

    def scale(z: torch.Tensor, head: str) -> float:
        t = match(z, target)
        t_safe, met = calibration.nll_guard(z, t, cosine, trust)
        guard[head] = {"matched_scale": t, "scale": t_safe, "softened": t_safe < t, "met": met}
        if not met:
            log.warning("transductive: no temperature of the %s head expects an NLL on the pool at most the cosine "
                        "head's under the label estimate %g·p + %.3g·p_cosine; it is as flat as allowed",
                        head, trust, 1 - trust)
        return t_safe

    lin = predictor.logits(fit.heads, P, kind, U_cal, "linear").double()
    if bool(torch.isfinite(lin).all()):
        temps["linear"] = 1.0 / scale(lin, "linear")
    if fit.heads.kernel.votes.is_sparse:   # the layout that carries a factor stores dense vote weights only
        return temps, powers, ("its vote weights are sparse (local); the artifact layout that carries a factor "
                               "needs dense ones"), guard
    if not k > 0:
        return temps, powers, "the transduction gave its prior no weight", guard
    z = k * kernel.double() + predictor.gaussian_log_likelihood(fit.gaussian.weight, fit.gaussian.bias, U_cal)
    if not bool(torch.isfinite(z).all()):
        return temps, powers, "its posterior's scores are not finite", guard
    t = scale(z, "kernel")
    temps["kernel"], powers["kernel"] = 1.0 / (t * k), t
    return temps, powers, None, guard


def _adopt_posterior(stage: Stage, side: TextSide, fit: PoolFit, U: torch.Tensor, scored: Scored, check: Check,
                     trust: float) -> tuple:
    """Without labels: the linear head the posterior, the kernel head that with the kernel vote as its prior
    (``scored``: the inductive default head on the pool); (heads, the inductive heads, the record's part, the default
    head)."""
    rows, agreement = calibration.calibration_rows(U.shape[0]), agreement_target(check)
    target = scored.entropy() if agreement is None else agreement
    kernel = (scored.scores[rows] if stage.default_head == "kernel" else
              predictor.scores(stage.heads, side.prototypes, side.config.kernel, U[rows], "kernel"))
    temps, powers, why, guard = _guard(side, fit, U[rows], kernel, target, agreement, trust)
    cal = predictor.with_temperatures(fit.heads.calibration, temps,
                                      method="entropy-matched" if agreement is None else "confidence-matched",
                                      rule=records.posterior_rule(agreement, trust),
                                      **({"kernel_logits": "score"} if powers else {}))
    kernel, ind = fit.heads.kernel, fit.inductive
    if powers and kernel.labels is None:   # rows one by one (the layout with a factor), shared with the inductive heads
        ss = kernel.support_set()
        kernel = KernelHead(ss.rows, kernel.bandwidth, kernel.votes, ss.labels, ss.source, kernel.prior_scale)
        ind = Heads(kernel, ind.linear, ind.calibration)
    WG, bG = fit.gaussian.weight.float(), fit.gaussian.bias.float()
    heads = Heads(kernel, fit.heads.linear, cal, PoolFactor(WG, bG, powers) if powers else None)
    return heads, ind, records.posterior(temps, powers, why, check, trust, guard), "linear"
