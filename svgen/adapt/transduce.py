"""The transduction on the inductive state, without any check: the prior, its calibration, the solve, the posterior."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from svgen.core.logits import KERNEL_LOG_FLOOR
from svgen.core.support import SupportSet
from svgen.adapt import lda as fewshot
from svgen.heads import predictor
from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen.adapt.config import AdaptConfig
from svgen.adapt.select import Decision
from svgen.state import Heads, LdaPart, LinearHead, TextSide
from svgen.adapt import transduction as td
from svgen.adapt.pool_decision import KEPT, Reason, fallback, refuse

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """The inductive state a pool adapts (``zero_shot``: the heads without shots; ``fewshot``: the shots' record;
    ``default_head``: the inductive default head, the transduction's prior; ``lda``: the LDA part of the shots' linear
    head)."""

    heads: Heads
    zero_shot: Heads
    fewshot: Optional[dict]
    shots: Optional[SupportSet]
    default_head: str
    lda: Optional[LdaPart] = None


@dataclass
class PoolFit:
    """The heads, record, pool probabilities, inductive heads replaced, linear head continued (``prior_linear``); from
    the solve, the pool's Gaussian class log-likelihood ``x̂ W_Gᵀ + b_G`` (``gaussian``) and the posterior's weight on
    the prior scores, β·t_prior (``prior_scale``)."""

    heads: Heads
    record: dict
    labels: Optional[torch.Tensor] = None
    inductive: Optional[Heads] = None
    prior_linear: Optional[LinearHead] = None
    decision: Decision = KEPT
    gaussian: Optional[LinearHead] = None
    prior_scale: float = 0.0
    default_head: Optional[str] = None   # kept: the default head it deploys (svgen.state.PoolOutcome)


def mean_entropy(heads: Heads, side: TextSide, U: torch.Tensor, head: str) -> float:
    """``head``'s mean entropy at its temperature on :func:`~svgen.adapt.transduction.calibration_rows` of ``U``."""
    z = predictor.logits(heads, side.prototypes, side.config.kernel, U[td.calibration_rows(U.shape[0])], head)
    return td._entropy(z.double() / heads.calibration.temperatures[head])


def _refused(heads: Heads, N: int, head: str, refusal: Decision, **extra) -> PoolFit:
    log.info("transductive: %s", fallback(refusal))
    return PoolFit(heads, {"pool": N, **refusal.to_json(), "prior_head": head, **extra}, decision=refusal)


def transduce(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float] = None, progress: bool = False,
              labels_entropy: Optional[float] = None, config: Optional[AdaptConfig] = None) -> PoolFit:
    """Re-solves the linear head on the unit pool ``U`` (the kernel head as it is); a refusal changes nothing."""
    C, N = side.n_classes, U.shape[0]
    P, kind, heads = side.prototypes, side.config.kernel, stage.heads
    head = stage.default_head   # the transduction's prior: the inductive predictor as deployed
    refusal = td.too_small(N, C, config)
    if refusal is not None:
        return _refused(heads, N, head, refusal)
    t0 = time.perf_counter()
    shots = stage.shots if stage.fewshot is not None else None
    fitted = shots is not None and bool((shots.counts(C) > 1).any())   # the solve continues their Gaussian model
    if fitted and stage.lda is None:
        raise ValueError("a stage with shots carries the LDA part of their linear head (Stage.lda)")
    part = stage.lda if fitted else None
    prior_linear = heads.linear if part is None else LinearHead(part.weight, part.bias)
    if shots is None:
        prior = predictor.scores_in_blocks(heads, P, kind, U, head)
    else:   # the inductive predictor as deployed: calibrated log-probabilities at T = 1
        prior = predictor.proba_in_blocks(heads, P, kind, U, head).clamp_min(KERNEL_LOG_FLOOR).log()
    timings = {"prior_scores": time.perf_counter() - t0}
    with torch.no_grad():
        precision = None
        if part is not None:   # its Σ and logits are a Gaussian model fitted on the shots: used as they are
            Sigma = fewshot.lda_covariance(shots.rows.double(), shots.labels, C, part.shrinkage)
            precision = torch.linalg.inv(Sigma).float()
            t_prior = t_lin = 1.0
            t_post, t_post_source = ((part.temperature, "the LDA part's leave-one-out NLL temperature on the shots")
                                     if part.temperature is not None
                                     else (1.0, "1 (the LDA part's temperature was not fitted)"))
        else:   # scales calibrated without labels (with one shot per class the prior is calibrated already)
            target = td._entropy(CLIP_LOGIT_SCALE * U[td.calibration_rows(N)] @ F.normalize(P.float(), dim=-1).T)
            t_prior = 1.0 if shots is not None else td.match_entropy(prior, target)
            t_lin = td.match_entropy(predictor.scores_in_blocks(heads, P, kind, U, "linear"), target)
            t_post, t_post_source = 1.0, "1 (no class model fitted on labels)"
        beta0 = td.prior_strength(N, C, 0 if part is None else len(shots)) if strength is None else float(strength)
        timings["calibration"] = time.perf_counter() - t0 - timings["prior_scores"]
        t1 = time.perf_counter()
        res, tries = td.settle(U, t_prior * prior, fewshot.prior_means(P, U.double()).float(),
                               beta0, shots_x=None if shots is None else shots.rows.float(),
                               shots_y=None if shots is None else shots.labels, precision=precision,
                               progress=progress, temperature=t_post, config=config)
    if res is None:
        return _refused(heads, N, head, refuse(Reason.DID_NOT_SETTLE, "the rounds did not settle at any prior "
                                               f"strength up to {tries[-1]['prior_strength']:.3g}"), tries=tries)
    timings["rounds"] = time.perf_counter() - t1
    beta = res.info["prior_strength"]
    ic = heads.calibration   # recorded so that adapting again (or a fall-back) restores it
    inductive_calibration = {"temperatures": dict(ic.temperatures), "kernel_logits": ic.kernel_logits,
                             **{k: getattr(ic, k) for k in ("kernel_floor", "mixture_weight")
                                if getattr(ic, k) is not None},
                             "calibration": json.loads(json.dumps(ic.record))}
    new = Heads(heads.kernel, LinearHead(res.weight + beta * t_lin * prior_linear.weight.float(),
                                         res.bias + beta * t_lin * prior_linear.bias.float()), ic)
    new.calibration = predictor.text_calibration(new, P, side.per_template, kind, only="linear")
    with torch.no_grad():   # the solve's posterior at the linear head's mean entropy on the pool (argmax unchanged)
        t_labels = td.match_entropy(res.logits, mean_entropy(new, side, U, "linear")
                                    if labels_entropy is None else labels_entropy)
        labels = torch.softmax(t_labels * res.logits.float(), dim=1)
    record = {**res.info, **KEPT.to_json(), "prior_head": head, "tries": tries,
              "prior_temperature": t_prior, "labels_temperature": 1.0 / t_labels,
              "linear_prior_temperature": t_lin, "calibration": "entropy of softmax(100·cos)",
              "posterior_temperature_source": t_post_source,
              "heads": {"linear": "transductive posterior", "kernel": "inductive"},
              "timings_s": timings, "wall_time_s": time.perf_counter() - t0,
              "inductive_calibration": inductive_calibration}
    log.info("transductive: %d images, β=%.3g, %d rounds, %.1f%% of the pool relabelled from the prior, %.2fs",
             N, beta, res.info["rounds"], 100 * res.info["changed_from_prior"], record["wall_time_s"])
    return PoolFit(new, record, labels, heads, prior_linear, gaussian=LinearHead(res.weight, res.bias),
                   prior_scale=beta * t_prior)
