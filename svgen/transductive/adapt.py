"""An unlabelled pool added to the inductive heads: the ``pool`` stage (:mod:`svgen.state`), kept only on
held-out evidence.

:func:`adapt` takes the inductive :class:`~svgen.transductive.pool.Stage` and the unit pool and returns a
:class:`~svgen.transductive.pool.PoolFit`: the heads to deploy (the inductive ones when the pool is refused), the record
(``svgen.json`` ``transductive``), the pool's probabilities, and the heads it replaced. The check is
:mod:`svgen.transductive.gate`; the solve :func:`svgen.transductive.pool.transduce`.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from svgen.transductive import gate as pool_gate
from svgen.heads import predictor
from svgen.selection import AdaptConfig, config_or_default
from svgen.transductive import solve as td
from svgen.selection import Decision
from svgen.transductive.decision import Check, Evidence, Reason, Replication, fallback, refuse
from svgen.transductive.pool import PoolFit, Stage, transduce
from svgen.state import Heads, KernelHead, PoolFactor, TextSide
from svgen.steps import Clock

log = logging.getLogger(__name__)


def adapt(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float] = None,
          progress: bool = False, config: Optional[AdaptConfig] = None) -> PoolFit:
    """The pool ``U`` (N×D, unit rows) checked and, where the check keeps it, solved in.

    * With labelled shots, held-out shots join the pool unlabelled (:func:`svgen.transductive.gate.shot_folds`: one
      shot of every class at a time from three shots up, else half of them) and the predictor is rebuilt without
      them; the inductive default head times the pool's Gaussian class likelihood to a power ``a`` (by held-out NLL,
      cross-fitted) must beat the inductive default head there (top-1 beyond chance by the exact sign test at the
      level of 1 SE, top-5 and NLL not worse by more than 1 SE). Kept, the default head and the linear head carry
      that factor, each at its own power (:func:`_adopt_factor`); the kernel head, where it is not the default,
      stays inductive.
    * Without labels, a head adapted on one half of the pool must agree with the other half's own posterior
      more often than the inductive head (beyond chance; top 5 not worse by more than 1 SE). Kept, the posterior
      ``β·t·(inductive linear logits) + Gaussian log-likelihood`` is the default linear head and the kernel head
      is the same posterior with the kernel vote as its prior (:func:`_adopt_posterior`), each at the temperature
      whose mean top-1 probability on the pool is the check's cross-half agreement (its label-free accuracy).

    Otherwise the heads stay exactly the inductive ones, the fit's :class:`~svgen.transductive.decision.Decision` and
    the record's ``fallback`` say why and its ``check`` holds the evidence; the pool's probabilities are then the inductive default head's. With shots for only some of
    the classes the pool is not used: its check sees only classes with shots."""
    C, N = side.n_classes, U.shape[0]
    t0 = time.perf_counter()
    clock = Clock(log)
    config = config_or_default(config)
    decision, check = td.too_small(N, C, config), None
    if decision is None and stage.shots is not None and len(stage.shots):
        without = int((stage.shots.counts(C) == 0).sum())
        if without:   # the held-out shots could not show what the pool does to those classes
            decision = refuse(Reason.CLASSES_WITHOUT_SHOTS,
                              f"{without} of the {C} classes have no labelled shots, and the check on "
                              "held-out shots cannot see what a pool does to them")
    if decision is None:
        check = (pool_gate.check_with_shots(stage, side, U, strength, progress=progress, config=config)
                 if stage.shots is not None and len(stage.shots)
                 else pool_gate.check_without_shots(stage, side, U, strength, progress=progress, config=config))
        clock.lap("pool check (%s) on %d images", check.evidence.value, N)
        decision = check.decision()
    if not decision.kept:
        record = {"pool": N, "fallback": None, "prior_head": stage.prior_head}
        record.update(decision.to_json())   # (the keys in the order svgen.json has always had them)
        return refused(stage, side, U, {**record, "wall_time_s": time.perf_counter() - t0}, decision)
    if check.evidence is Evidence.SHOTS:
        return _adopt_factor(stage, side, U, strength, progress, check, t0, config)
    head = stage.default_head
    rows = td.calibration_rows(N)
    entropy_before = td._entropy(predictor.logits(stage.heads, side.prototypes, side.config.kernel, U[rows], head)
                                 .double() / stage.heads.calibration.temperatures[head])
    fit = transduce(stage, side, U, strength, progress, labels_entropy=entropy_before, config=config)
    if not fit.decision.kept:
        return refused(stage, side, U, fit.record, fit.decision)
    fit = _adopt_posterior(stage, side, fit, U, U[rows], entropy_before, agreement_target(check))
    fit.record.update({"check": check.to_json(), "default_head": "linear", "wall_time_s": time.perf_counter() - t0})
    fit.decision = decision
    return fit


def agreement_target(check: Check) -> Optional[float]:
    """The mean top-1 probability a kept zero-shot pool's heads are given: the check's cross-half agreement,
    ``k`` of ``n`` pool images, as ``(k + 1)/(n + 2)`` (the rule of succession: the mean of a uniform prior's
    posterior for a rate seen k times in n, so that full agreement on a small pool does not claim certainty).
    None where the check measured none."""
    stats = check.gate.stats if check.gate is not None else None
    if not isinstance(stats, Replication):
        return None
    a, n = stats.agreement.candidate, stats.agreement.n
    if not n:
        return float(a)
    return (float(a) * int(n) + 1.0) / (int(n) + 2.0)


def refused(stage: Stage, side: TextSide, U: torch.Tensor, record: dict, decision: Decision) -> PoolFit:
    """A pool that changes nothing (``decision`` says why, in one warning; ``record`` is what ``svgen.json``
    keeps): the inductive heads, and as the pool's probabilities the inductive default head's (what ``classify``
    without ``--transductive`` prints), not the transduction's prior head's."""
    log.warning("transductive: %s", fallback(decision))
    head = stage.default_head
    s = predictor.scores_in_blocks(stage.heads, side.prototypes, side.config.kernel, U, head)
    floored = predictor.needs_prior(stage.heads, head)
    prior = predictor.kernel_prior(stage.heads, side.prototypes, U) if floored else None
    return PoolFit(stage.heads, record, predictor.proba_of_scores(stage.heads, s, head, prior), None, decision=decision)


def _adopt_factor(stage: Stage, side: TextSide, U, strength, progress, check: Check, t0: float,
                  config: AdaptConfig) -> PoolFit:
    """With shots, the pool multiplies the heads the check fitted a power for (the default head; the linear head) by
    its Gaussian class likelihood: ``p_h(x) ∝ p_h⁰(x)·exp(a_h·(x̂ W_Gᵀ + b_G))``, p_h⁰ the head as the shots left it
    (:class:`svgen.state.PoolFactor`; a_h by the NLL of held-out shots that were pool members,
    :func:`svgen.transductive.gate.check_with_shots`). The heads themselves, their temperatures and the default head
    stay the inductive ones; a head with no power (a = 0, or the kernel head where it is not the default) is
    unchanged."""
    fit = transduce(stage, side, U, strength, progress, config=config)
    if not fit.decision.kept:
        return refused(stage, side, U, fit.record, fit.decision)
    WG, bG = pool_gate.pool_parts(fit.record, fit.heads.linear, fit.prior_linear.weight, fit.prior_linear.bias)
    powers = {h: float(a) for h, a in check.powers.items() if a > 0}
    ind = stage.heads
    heads = Heads(ind.kernel, ind.linear, ind.calibration,
                  PoolFactor(WG.float(), bG.float(), powers) if powers else None)
    default = stage.default_head
    labels = predictor.proba_in_blocks(heads, side.prototypes, side.config.kernel, U, default)
    record = {**fit.record, "check": check.to_json(), "default_head": default, "wall_time_s": time.perf_counter() - t0,
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
    # the heads are the inductive ones (the same tensors: an artifact stores them once); adapting again drops the factor
    return PoolFit(heads, record, labels, Heads(ind.kernel, ind.linear, ind.calibration), fit.prior_linear,
                   check.decision())


def _adopt_posterior(stage: Stage, side: TextSide, fit: PoolFit, U: torch.Tensor, U_cal: torch.Tensor,
                     entropy_before: float, agreement: Optional[float] = None) -> PoolFit:
    """Without labels, a kept pool deploys the transduction's posterior on new images, through both heads, each at
    the temperature whose mean top-1 probability on the pool is ``agreement``: how often a head adapted on one half
    of the pool predicts the other half's own posterior class (the check's ``agreement_pool``,
    :func:`svgen.transductive.gate.check_without_shots`, as :func:`agreement_target`) — an accuracy measured on
    images the head did not see,
    against the pool's own labels, with no true label; a calibrated head's mean top-1 probability is its accuracy.
    A temperature does not move any argmax. (Without that number, the inductive default head's mean entropy on the
    pool, ``entropy_before``: that target ignores what the pool gained, and leaves the head under-confident;
    docs/calibration.md.)

    * linear: the solved head ``x̂ (W_G + β·t_l·W₀)ᵀ + …``, the Gaussian class log-likelihood plus the inductive
      linear logits it continued (:func:`svgen.transductive.pool.transduce`);
    * kernel: the same posterior with the kernel vote itself as the prior, as the solve had it:
      ``z = β·t_p·s(x) + x̂ W_Gᵀ + b_G`` (s the inductive kernel scores, t_p the prior's temperature, β its strength),
      stored as the kernel head's scores at ``T = 1/(t·β·t_p)`` times the pool's likelihood to the power ``t``
      (:class:`svgen.state.PoolFactor`), t the confidence-matching scale of z. Its rows and votes stay the inductive
      ones, listed one by one (the format that carries a factor).

    The kernel vote re-solved with pool rows of soft class instead mis-ranks the lower classes (dev data, caltech101,
    the whole validation set as the pool: NLL +0.09 and top-5 −0.30 against the inductive kernel head; this form
    −0.065 and 0.00; docs/history.md)."""
    P, kind, rec = side.prototypes, side.config.kernel, fit.record
    WG, bG = pool_gate.pool_parts(rec, fit.heads.linear, fit.prior_linear.weight, fit.prior_linear.bias)
    k = float(rec["prior_strength"]) * float(rec["prior_temperature"])
    temps, powers, why = {}, {}, None

    def scale(z: torch.Tensor) -> float:
        return td.match_entropy(z, entropy_before) if agreement is None else td.match_confidence(z, agreement)

    with torch.no_grad():
        lin = predictor.logits(fit.heads, P, kind, U_cal, "linear").double()
        if bool(torch.isfinite(lin).all()):
            temps["linear"] = 1.0 / scale(lin)
        if fit.heads.kernel.votes.is_sparse:   # (the rows-one-by-one layout stores dense vote weights only)
            why = "its vote weights are sparse (local); the artifact layout that carries a factor needs dense ones"
        elif not k > 0:
            why = "the transduction gave its prior no weight"
        else:
            z = (k * predictor.scores(stage.heads, P, kind, U_cal, "kernel").double()
                 + predictor.gaussian_log_likelihood(WG, bG, U_cal))
            if bool(torch.isfinite(z).all()):
                t = scale(z)
                temps["kernel"], powers["kernel"] = 1.0 / (t * k), t
            else:
                why = "its posterior's scores are not finite"
    rule = ("after a pool without labels: T giving each adapted head the inductive default head's mean entropy on "
            "the pool" if agreement is None else
            f"after a pool without labels: T giving each adapted head a mean top-1 probability on the pool of "
            f"{agreement:.4g}, how often a head adapted on one half of the pool predicts the other half's own "
            "posterior class (transductive.check.agreement_pool)")
    cal = predictor.with_temperatures(fit.heads.calibration, temps,
                                      method="entropy-matched" if agreement is None else "confidence-matched",
                                      rule=rule,
                                      **({"kernel_logits": "score"} if powers else {}))
    kernel, ind = fit.heads.kernel, fit.inductive
    if powers and kernel.labels is None:
        # the rows one by one, the layout of formats 2 and later, which carry a factor; the inductive heads share the
        # object, so an artifact stores the vote once
        ss = kernel.support_set()
        kernel = KernelHead(ss.rows, kernel.bandwidth, kernel.votes, ss.labels, ss.source, kernel.prior_scale)
        ind = Heads(kernel, ind.linear, ind.calibration)
    heads = Heads(kernel, fit.heads.linear, cal, PoolFactor(WG.float(), bG.float(), powers) if powers else None)
    record = {**rec, "heads": {"linear": "transductive posterior",
                               "kernel": (f"the transductive posterior with the kernel vote as its prior (the "
                                          f"inductive kernel scores at T = {temps['kernel']:.4g} × pool likelihood^"
                                          f"{powers['kernel']:.4g})") if powers else f"inductive ({why})"},
              "kernel_head": {"replaced": False, "factor": bool(powers),
                              "reason": ("the pool multiplies the kernel vote by its likelihood: the transduction's "
                                         "posterior with the vote as its prior") if powers else why},
              **({"pool_factor": {"powers": powers,
                                  "rule": "p_kernel(x) ∝ softmax(s(x)/T) · exp(a · (x̂ W_Gᵀ + b_G)), s the "
                                          "inductive kernel scores, T = 1/(a·β·t_prior): the solve's posterior "
                                          "β·t_prior·s(x) + x̂ W_Gᵀ + b_G at the confidence-matching scale a"}}
                 if powers else {})}
    # the pool's probabilities are the deployed default head's on it (as with shots, and as a refused pool's are): what
    # the adapted artifact gives these images, so `classify --transductive` and `adapt` + `classify --probs` agree
    labels = predictor.proba_in_blocks(heads, P, kind, U, "linear")
    return PoolFit(heads, record, labels, ind, fit.prior_linear)
