"""The transduction on the inductive state, without any check: the prior, its calibration, the solve, the posterior."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from collections import namedtuple
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from svgen.core.logits import KERNEL_LOG_FLOOR
from svgen.core.support import SupportSet
from svgen.adapt import lda as fewshot
from svgen.heads import calibration, predictor
from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen import records
from svgen.adapt.config import AdaptConfig
from svgen.state import KEPT, Decision, Heads, LdaPart, LinearHead, Reason, TextSide, refuse
from svgen.adapt.solvers import transduction as td
from svgen.steps import bar

log = logging.getLogger(__name__)
BLOCK = 8192   # pool rows scored at a time (a kernel head's N×M kernel never whole)


@dataclass
class Stage:
    """The inductive state a pool adapts: ``zero_shot`` the heads without shots, ``shots`` those the heads were
    adapted to (None: none), ``default_head`` the transduction's prior, ``lda`` the LDA part of their linear head."""

    heads: Heads
    zero_shot: Heads
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


class Scored(NamedTuple):
    """A stage's default head on the pool, scored once: its scores, the logits its softmax takes, its temperature."""

    scores: torch.Tensor
    logits: torch.Tensor
    temperature: float

    def proba(self) -> torch.Tensor:
        return calibration.softmax(self.logits, self.temperature)

    def rows(self, rows) -> "Scored":
        return Scored(self.scores[rows], self.logits[rows], self.temperature)

    def entropy(self) -> float:
        """The mean entropy on :func:`~svgen.heads.calibration.calibration_rows`."""
        rows = calibration.calibration_rows(self.logits.shape[0])
        return calibration.entropy(self.logits[rows].double() / self.temperature)


def score(stage: Stage, side: TextSide, U: torch.Tensor) -> Scored:
    """The stage's default head on ``U``, in row blocks."""
    h, P, kind = stage.default_head, side.prototypes, side.config.kernel
    parts = [predictor.scores_and_logits(stage.heads, P, kind, U[s:s + BLOCK], h) for s in range(0, U.shape[0], BLOCK)]
    return Scored(torch.cat([s.float() for s, _ in parts]), torch.cat([z for _, z in parts]),
                  predictor.temperature(stage.heads, h))


def settings(config: AdaptConfig) -> td.Settings:
    return td.Settings(**{f: getattr(config, f) for f in td.Settings._fields})


def too_small(n_pool: int, n_classes: int, config: AdaptConfig) -> Optional[Decision]:
    """The refusal of a pool too small to use (None: use it)."""
    if n_pool < config.min_pool_per_class * n_classes:
        return refuse(Reason.POOL_TOO_SMALL, f"pool of {n_pool} unlabelled images is smaller than the {n_classes} classes")
    return None


def settle(U: torch.Tensor, prior_logits: torch.Tensor, means: torch.Tensor, beta0: float, settings: td.Settings,
           **kw) -> tuple:
    """(Transduction or None, tries): the solve at β₀, β₀·escalate, …, the first whose rounds settle (their last two
    agree on ``stable`` of the pool); None when none does within ``max_escalations``."""
    tries, beta = [], beta0
    graph = td.knn_graph(U.float(), settings.neighbours)
    for _ in range(settings.max_escalations + 1):
        res = td.transduce(U, prior_logits, means, settings, strength=beta, graph=graph, **kw)
        last = res.info["round_agreement"][-1]
        tries.append({"prior_strength": beta, "rounds": res.info["rounds"], "last_agreement": last,
                      "settled": last >= settings.stable})
        if last >= settings.stable:
            return res, tries
        log.info("transductive: β=%.3g did not settle (agreement %.4f); raising it", beta, last)
        beta *= settings.escalate
    return None, tries


def _refused(heads: Heads, N: int, head: str, refusal: Decision, **extra) -> PoolFit:
    log.info("transductive: %s", records.fallback(refusal))
    return PoolFit(heads, records.refused(N, head, refusal, **extra), decision=refusal)


# the solve's prior: its logits, the linear head it continues, the LDA part's Σ⁻¹ (or None), the stage's shots (or
# None), the scales of the prior and of that linear head, the posterior's temperature and where it comes from
Prior = namedtuple("Prior", "logits linear precision shots t_prior t_lin t_post t_post_source")


def prior(stage: Stage, side: TextSide, U: torch.Tensor, scored: Scored) -> Prior:
    """With shots, the inductive predictor as deployed (calibrated log-probabilities at T = 1) and, where some class
    has two shots, the LDA part's Gaussian model as it is; else scales calibrated without labels."""
    C, P, heads = side.n_classes, side.prototypes, stage.heads
    shots = stage.shots
    fitted = shots is not None and bool((shots.counts(C) > 1).any())   # the solve continues their Gaussian model
    if fitted and stage.lda is None:
        raise ValueError("a stage with shots carries the LDA part of their linear head (Stage.lda)")
    part = stage.lda if fitted else None
    logits = scored.scores if shots is None else scored.proba().float().clamp_min(KERNEL_LOG_FLOOR).log()
    if part is not None:   # its Σ and logits are a Gaussian model fitted on the shots: used as they are
        Sigma, T = fewshot.lda_covariance(shots.rows.double(), shots.labels, C, part.shrinkage), part.temperature
        return Prior(logits, LinearHead(part.weight, part.bias), torch.linalg.inv(Sigma).float(), shots, 1.0, 1.0,
                     1.0 if T is None else T, "1 (the LDA part's temperature was not fitted)" if T is None
                     else "the LDA part's leave-one-out NLL temperature on the shots")
    U_cal = U[calibration.calibration_rows(U.shape[0])]   # the rows the temperature matches look at
    target = calibration.entropy(CLIP_LOGIT_SCALE * U_cal @ F.normalize(P.float(), dim=-1).T)
    t_prior = 1.0 if shots is not None else calibration.match_entropy(logits, target)   # one shot per class: calibrated
    t_lin = calibration.match_entropy(predictor.scores(heads, P, side.config.kernel, U_cal, "linear"), target)
    return Prior(logits, heads.linear, None, shots, t_prior, t_lin, 1.0, "1 (no class model fitted on labels)")


def transduce(stage: Stage, side: TextSide, U: torch.Tensor, scored: Scored, config: AdaptConfig,
              strength: Optional[float] = None, progress: bool = False,
              labels_entropy: Optional[float] = None) -> PoolFit:
    """Re-solves the linear head on the unit pool ``U`` (the kernel head as it is) from the stage's default head
    ``scored`` on it; a refusal changes nothing."""
    N, head = U.shape[0], stage.default_head   # the transduction's prior: the inductive predictor as deployed
    refusal = too_small(N, side.n_classes, config)
    if refusal is not None:
        return _refused(stage.heads, N, head, refusal)
    t0 = time.perf_counter()
    with torch.no_grad():
        pr = prior(stage, side, U, scored)
        fitted = 0 if pr.precision is None else len(pr.shots)   # shots the prior's class model was fitted on
        beta0 = td.prior_strength(N, side.n_classes, fitted) if strength is None else float(strength)
        t1 = time.perf_counter()
        res, tries = settle(U, pr.t_prior * pr.logits, fewshot.prior_means(side.prototypes, U.double()).float(),
                            beta0, settings(config), shots_x=None if pr.shots is None else pr.shots.rows.float(),
                            shots_y=None if pr.shots is None else pr.shots.labels, precision=pr.precision,
                            temperature=pr.t_post,
                            each=lambda r: bar(r, progress, desc="transductive rounds", unit="round"))
    if res is None:
        return _refused(stage.heads, N, head, refuse(Reason.DID_NOT_SETTLE, "the rounds did not settle at any prior "
                                                     f"strength up to {tries[-1]['prior_strength']:.3g}"), tries=tries)
    timings = {"calibration": t1 - t0, "rounds": time.perf_counter() - t1}
    return _adopted(stage, side, U, res, pr, labels_entropy, config, t0, tries=tries, timings_s=timings)


def _adopted(stage: Stage, side: TextSide, U: torch.Tensor, res: td.Transduction, pr: Prior,
             labels_entropy: Optional[float], config: AdaptConfig, t0: float, **extra) -> PoolFit:
    """The solve kept: the linear head its posterior (continuing ``pr.linear``), the pool's labels and record."""
    beta, heads, ic = res.info["prior_strength"], stage.heads, stage.heads.calibration
    w = beta * pr.t_lin
    new = Heads(heads.kernel, LinearHead(res.weight + w * pr.linear.weight.float(),
                                         res.bias + w * pr.linear.bias.float()), ic)
    new.calibration = predictor.text_calibration(new, side.prototypes, side.per_template, side.config.kernel,
                                                 only="linear", config=config)
    with torch.no_grad():   # the solve's posterior at the linear head's mean entropy on the pool (argmax unchanged)
        if labels_entropy is None:
            U_cal = U[calibration.calibration_rows(U.shape[0])]
            z = predictor.logits(new, side.prototypes, side.config.kernel, U_cal, "linear")
            labels_entropy = calibration.entropy(z.double() / new.calibration.temperatures["linear"])
        t_labels = calibration.match_entropy(res.logits, labels_entropy)
        labels = torch.softmax(t_labels * res.logits.float(), dim=1)
    record = records.transduced(res.info, stage.default_head, extra, pr, t_labels, time.perf_counter() - t0, ic)
    log.info("transductive: %d images, β=%.3g, %d rounds, %.1f%% of the pool relabelled from the prior, %.2fs",
             U.shape[0], beta, res.info["rounds"], 100 * res.info["changed_from_prior"], record["wall_time_s"])
    return PoolFit(new, record, labels, heads, pr.linear, gaussian=LinearHead(res.weight, res.bias),
                   prior_scale=beta * pr.t_prior)
