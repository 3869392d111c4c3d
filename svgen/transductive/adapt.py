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
from svgen.transductive import solve as td
from svgen.transductive.pool import PoolFit, Stage, transduce
from svgen.state import Heads, PoolFactor, TextSide

log = logging.getLogger(__name__)

HEADS_FITTED_BY_POOL = ("kernel", "linear")   # the heads a pool re-solves (cosine stays CLIP's)


def adapt(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float] = None,
          progress: bool = False) -> PoolFit:
    """The pool ``U`` (N×D, unit rows) checked and, where the check keeps it, solved in.

    * With labelled shots, held-out shots join the pool unlabelled (:func:`svgen.transductive.gate.shot_folds`: one
      shot of every class at a time from three shots up, else half of them) and the predictor is rebuilt without
      them; the inductive default head times the pool's Gaussian class likelihood to a power ``a`` (by held-out NLL,
      cross-fitted) must beat the inductive default head there (top-1 by more than 1 SE, top-5 and NLL not worse
      by more than 1 SE). Kept, the default head and the linear head carry that factor, each at its own power
      (:func:`_adopt_factor`); the kernel head, where it is not the default, stays inductive.
    * Without labels, a head adapted on one half of the pool must agree with the other half's own posterior
      more often than the inductive head (by more than 1 SE; top 5 not worse). Kept, the posterior
      ``β·t·(inductive linear logits) + Gaussian log-likelihood`` is the default linear head and the kernel vote
      is re-solved with pool rows of soft class (:func:`pool_kernel_head`), each at the inductive default
      head's mean entropy on the pool.

    Otherwise the heads stay exactly the inductive ones, the record's ``fallback`` says why and its ``check``
    holds the evidence; the pool's probabilities are then the inductive default head's. With shots for only some of
    the classes the pool is not used: its check sees only classes with shots."""
    C, N = side.n_classes, U.shape[0]
    t0 = time.perf_counter()
    reason, check = td.fallback_reason(N, C), None
    if reason is None and stage.shots is not None and len(stage.shots):
        without = int((stage.shots.counts(C) == 0).sum())
        if without:   # the held-out shots could not show what the pool does to those classes
            reason = (f"{without} of the {C} classes have no labelled shots, and the check on held-out shots "
                      "cannot see what a pool does to them; kept the inductive heads")
    if reason is None:
        check = (pool_gate.check_with_shots(stage, side, U, strength, progress=progress)
                 if stage.shots is not None and len(stage.shots)
                 else pool_gate.check_without_shots(stage, side, U, strength, progress=progress))
        if not check["adopt"]:
            reason = check["reason"] + "; kept the inductive heads"
    if reason is not None:
        return refused(stage, side, U, {"pool": N, "fallback": reason, "prior_head": stage.prior_head,
                                        **({"check": check} if check else {}), "wall_time_s": time.perf_counter() - t0})
    if check["evidence"] == "held-out shots as pool members":
        return _adopt_factor(stage, side, U, strength, progress, check, t0)
    head = stage.default_head
    rows = td.calibration_rows(N)
    entropy_before = td._entropy(predictor.logits(stage.heads, side.prototypes, side.config.kernel, U[rows], head)
                                 .double() / stage.heads.calibration.temperatures[head])
    fit = transduce(stage, side, U, strength, progress, labels_entropy=entropy_before)
    if fit.record.get("fallback"):
        return refused(stage, side, U, fit.record)
    fit.heads.calibration = _entropy_matched(fit.heads, side, U[rows], entropy_before,
                                             bool((fit.record.get("kernel_head") or {}).get("replaced")))
    fit.record.update({"check": check, "default_head": "linear", "wall_time_s": time.perf_counter() - t0})
    return fit


def refused(stage: Stage, side: TextSide, U: torch.Tensor, record: dict) -> PoolFit:
    """A pool that changes nothing (``record["fallback"]`` says why, in one warning): the inductive heads, and as
    the pool's probabilities the inductive default head's (what ``classify`` without ``--transductive`` prints),
    not the transduction's prior head's."""
    log.warning("transductive: %s", record["fallback"])
    head = stage.default_head
    s = predictor.scores_in_blocks(stage.heads, side.prototypes, side.config.kernel, U, head)
    floored = predictor.needs_prior(stage.heads, head)
    prior = predictor.kernel_prior(stage.heads, side.prototypes, U) if floored else None
    return PoolFit(stage.heads, record, predictor.proba_of_scores(stage.heads, s, head, prior), None)


def _adopt_factor(stage: Stage, side: TextSide, U, strength, progress, check: dict, t0: float) -> PoolFit:
    """With shots, the pool multiplies the heads the check fitted a power for (the default head; the linear head) by
    its Gaussian class likelihood: ``p_h(x) ∝ p_h⁰(x)·exp(a_h·(x̂ W_Gᵀ + b_G))``, p_h⁰ the head as the shots left it
    (:class:`svgen.state.PoolFactor`; a_h by the NLL of held-out shots that were pool members,
    :func:`svgen.transductive.gate.check_with_shots`). The heads themselves, their temperatures and the default head
    stay the inductive ones; a head with no power (a = 0, or the kernel head where it is not the default) is
    unchanged."""
    fit = transduce(stage, side, U, strength, progress)
    if fit.record.get("fallback"):
        return refused(stage, side, U, fit.record)
    WG, bG = pool_gate.pool_parts(fit.record, fit.heads.linear, fit.prior_linear.weight, fit.prior_linear.bias)
    powers = {h: float(a) for h, a in check["powers"].items() if a > 0}
    ind = stage.heads
    heads = Heads(ind.kernel, ind.linear, ind.calibration,
                  PoolFactor(WG.float(), bG.float(), powers) if powers else None)
    default = stage.default_head
    labels = predictor.proba_in_blocks(heads, side.prototypes, side.config.kernel, U, default)
    record = {**fit.record, "check": check, "default_head": default, "wall_time_s": time.perf_counter() - t0,
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
    return PoolFit(heads, record, labels, Heads(ind.kernel, ind.linear, ind.calibration), fit.prior_linear)


def _entropy_matched(heads: Heads, side: TextSide, U_cal: torch.Tensor, entropy_before: float,
                     kernel_resolved: bool = False):
    """Without labels: the pool-adapted heads' temperatures are the scales at which each head's mean entropy on
    the pool is what the inductive default head's was (the ranking may move, the claimed certainty may not).

    A kernel vote re-solved with pool rows (``kernel_resolved``) is scored by its scores themselves (``"score"``
    logits): its ridge solve on the pool's soft labels gives scores of either sign, and ``"log"`` logits put every
    class scored ≤ 0 at 10⁻³⁰ — images whose own pool row carries a wrong soft label then get their class's
    probability near e⁻⁵⁶ (dev data, ucf101 zero-shot, the whole validation set as the pool: the re-solved kernel
    head's NLL 3.42 against the inductive 1.73, its 99th percentile 56; with ``"score"`` 1.77, the top-1 the same)."""
    temps = {}
    for h in HEADS_FITTED_BY_POOL:
        # the "score" logits of a re-solved kernel vote are its scores
        of = predictor.scores if h == "kernel" and kernel_resolved else predictor.logits
        z = of(heads, side.prototypes, side.config.kernel, U_cal, h).double()
        if bool(torch.isfinite(z).all()):
            temps[h] = 1.0 / td.match_entropy(z, entropy_before)
    if not temps:
        return heads.calibration
    return predictor.with_temperatures(heads.calibration, temps, method="entropy-matched",
                                       rule="after a pool without labels: T giving each adapted head the inductive "
                                            "default head's mean entropy on the pool",
                                       **({"kernel_logits": "score"} if kernel_resolved and "kernel" in temps else {}))


