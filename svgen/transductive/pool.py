"""The transduction on an unlabelled pool as a solve on plain state, without any check (:mod:`svgen.transductive.adapt`
decides what is kept; :mod:`svgen.transductive.gate` runs this on parts of the pool and of the shots).

The pool is pseudo-labelled by the current heads and the class model re-solved in closed form for a few rounds
(:mod:`svgen.transductive.solve`), with the inductive prediction kept as a prior (zero-shot: the kernel head's
scores, entropy-calibrated; with shots: the inductive default head's calibrated probabilities). A pool with fewer
images than classes changes nothing; the prior strength starts at :func:`svgen.transductive.solve.prior_strength` and
is raised while the rounds do not settle; if they never do, nothing changes.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from svgen.fewshot import lda as fewshot
from svgen.fewshot import linear as linear_head
from svgen.heads import predictor
from svgen.selection import AdaptConfig
from svgen.transductive import solve as td
from svgen.selection import Decision
from svgen.transductive.decision import KEPT, Reason, fallback, refuse
from svgen.calibration.temperatures import KERNEL_LOG_FLOOR
from svgen.heads.scoring import CLIP_LOGIT_SCALE
from svgen.core.support import SupportSet
from svgen.state import Heads, LinearHead, TextSide

log = logging.getLogger(__name__)

def prior_head(fewshot: Optional[dict]) -> str:
    """The head whose prediction is the transductive prior: the kernel vote zero-shot; with shots (``fewshot``, the
    shots stage's record) the inductive default head — the predictor as deployed, whose calibrated probabilities are
    the prior as they are (the LDA head's logits as the prior gave a mean gain of +1.35 where this gives +3.99: dev
    data, 1 shot, whole pool). The Gaussian class model the transduction solves still continues the LDA head (its part)."""
    return "kernel" if fewshot is None else fewshot.get("default_head", "linear")


@dataclass
class Stage:
    """The inductive state a pool adapts: the deployed ``heads`` (calibrated), the ``zero_shot`` heads (the
    same object without shots), the shots stage's record and shots (None zero-shot), and the default head."""

    heads: Heads
    zero_shot: Heads
    fewshot: Optional[dict]
    shots: Optional[SupportSet]
    default_head: str

    @property
    def prior_head(self) -> str:
        return prior_head(self.fewshot)


@dataclass
class PoolFit:
    """The pool stage: the heads to deploy, the record, the pool's N×C probabilities, and the inductive heads
    it replaced (None: nothing was replaced)."""

    heads: Heads
    record: dict
    labels: Optional[torch.Tensor] = None
    inductive: Optional[Heads] = None
    prior_linear: Optional[LinearHead] = None   # the linear head the solve continued: ``linear = W_G + β·t·prior_linear``
    decision: Decision = KEPT   # whether the pool changed the heads, and why not (the record's ``fallback`` says it too)


def lda_loo_temperature(heads: Heads):
    """(T, why) for the transductive posterior with a class model fitted on shots: the inductive LDA head's
    temperature when the shots' leave-one-out NLL fitted it (``calibration.loo.linear``), else 1 (the solve at
    the Gaussian's own scale, as before there was a fitted one)."""
    cal = heads.calibration.record or {}
    loo = (cal.get("loo") or {}).get("linear") or {}
    if cal.get("method") == "loo-nll" and loo.get("fitted"):
        return float(heads.calibration.temperatures["linear"]), "the LDA head's leave-one-out NLL temperature on the shots"
    return 1.0, "1 (the LDA head's temperature was not fitted on the shots)"


def transduce(stage: Stage, side: TextSide, U: torch.Tensor, strength: Optional[float] = None, progress: bool = False,
              labels_entropy: Optional[float] = None, config: Optional[AdaptConfig] = None) -> PoolFit:
    """The transduction itself (no check): re-solves the linear head on the unit pool ``U`` from the inductive heads
    (the kernel head is left as it is: :mod:`svgen.transductive.adapt` gives it the pool's factor).
    ``labels_entropy``: the pool probabilities' mean entropy (default: the adapted linear head's at its text-rule
    temperature). A refused :attr:`PoolFit.decision`: nothing changed."""
    C, N = side.n_classes, U.shape[0]
    P, kind, heads = side.prototypes, side.config.kernel, stage.heads
    head = stage.prior_head
    refusal = td.too_small(N, C, config)
    if refusal is not None:   # the caller says so (a half of the pool, in the check, is only recorded)
        log.info("transductive: %s", fallback(refusal))
        return PoolFit(heads, {"pool": N, **refusal.to_json(), "prior_head": head}, decision=refusal)
    t0 = time.perf_counter()
    shots = stage.shots if stage.fewshot is not None else None
    fitted = shots is not None and bool((shots.counts(C) > 1).any())
    # with shots the linear head may be zero-shot logits + α·LDA logits (svgen.fewshot.linear): the solve continues
    # its LDA part, the Gaussian class model
    part = linear_head.lda_part(P, shots, C, stage.fewshot.get("linear")) if fitted else None
    prior_linear = heads.linear if part is None else LinearHead(part[0], part[1])
    lin_heads = heads if part is None else Heads(heads.kernel, prior_linear, heads.calibration)
    if shots is None:
        prior = predictor.scores_in_blocks(lin_heads, P, kind, U, head)
    else:   # the inductive predictor as deployed: its calibrated probabilities, as log-probabilities at T = 1
        prior = predictor.proba_in_blocks(heads, P, kind, U, head).clamp_min(KERNEL_LOG_FLOOR).log()
    timings = {"prior_scores": time.perf_counter() - t0}
    with torch.no_grad():
        cal = U[td.calibration_rows(N)]
        target = td._entropy(CLIP_LOGIT_SCALE * cal @ F.normalize(P.float(), dim=-1).T)
        lin = predictor.scores_in_blocks(lin_heads, P, kind, U, "linear")
        # with a within-class scatter the LDA head's Σ is fitted on the shots and its logits are log-likelihood
        # ratios of that Gaussian model: used as they are; otherwise (zero-shot, or one shot per class, Σ = I) the
        # LDA logits' scale is calibrated without labels, and so is the zero-shot prior's
        precision = None
        if fitted:
            Sigma = fewshot.lda_covariance(shots.rows.double(), shots.labels, C,
                                           float(stage.fewshot["linear"]["shrinkage"]))
            precision = torch.linalg.inv(Sigma).float()
            t_prior = t_lin = 1.0
            if part is None:
                t_post, t_post_source = lda_loo_temperature(heads)
            else:
                t_post, t_post_source = ((part[2], "the LDA part's leave-one-out NLL temperature on the shots")
                                         if part[3] else (1.0, "1 (the LDA part's temperature was not fitted)"))
        else:
            # (with shots the prior is calibrated already: one shot per class, its leave-one-out temperatures)
            t_prior = 1.0 if shots is not None else td.match_entropy(prior, target)
            t_lin = td.match_entropy(lin, target)
            t_post, t_post_source = 1.0, "1 (no class model fitted on labels)"
        beta0 = td.prior_strength(N, C, len(shots) if fitted else 0) if strength is None else float(strength)
        timings["calibration"] = time.perf_counter() - t0 - timings["prior_scores"]
        t1 = time.perf_counter()
        res, tries = td.settle(U, t_prior * prior, fewshot.prior_means(P, U.double()).float(),
                               beta0, shots_x=None if shots is None else shots.rows.float(),
                               shots_y=None if shots is None else shots.labels, precision=precision,
                               progress=progress, temperature=t_post, config=config)
    if res is None:
        refusal = refuse(Reason.DID_NOT_SETTLE, "the rounds did not settle at any prior strength up to "
                                                f"{tries[-1]['prior_strength']:.3g}")
        log.info("transductive: %s", fallback(refusal))
        return PoolFit(heads, {"pool": N, **refusal.to_json(), "prior_head": head, "tries": tries}, decision=refusal)
    timings["rounds"] = time.perf_counter() - t1
    beta = res.info["prior_strength"]
    # what the inductive heads' probabilities were, so adapting again (or a fall-back) restores them too
    ic = heads.calibration
    inductive_calibration = {"temperatures": dict(ic.temperatures), "kernel_logits": ic.kernel_logits,
                             **({"kernel_floor": ic.kernel_floor} if ic.kernel_floor is not None else {}),
                             **({"mixture_weight": ic.mixture_weight} if ic.mixture_weight is not None else {}),
                             "calibration": json.loads(json.dumps(ic.record))}
    new = Heads(heads.kernel, LinearHead(res.weight + beta * t_lin * prior_linear.weight.float(),
                                         res.bias + beta * t_lin * prior_linear.bias.float()), ic)
    # the linear head's temperature follows the text rule (adapt then replaces it); the kernel head keeps its own
    new.calibration = predictor.text_calibration(new, P, side.per_template, kind, only="linear")
    # the solve's pool probabilities (the check's posterior; a kept pool prints its deployed head's instead): the
    # posterior's logits at the temperature
    # that gives them the mean entropy of the linear head — the head that carries the posterior to new images,
    # at its own T — on the pool; the solve's z_i are sharper (without a fitted class model a 512-d Gaussian
    # likelihood at its own scale; with one, at the LDA head's T but still plus the k-NN term). A temperature:
    # the argmax stays the posterior's.
    with torch.no_grad():
        rows = td.calibration_rows(N)
        target = (td._entropy(predictor.logits(new, P, kind, U[rows], "linear").double()
                              / new.calibration.temperatures["linear"])
                  if labels_entropy is None else labels_entropy)
        t_labels = td.match_entropy(res.logits, target)
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
    return PoolFit(new, record, labels, heads, prior_linear)
