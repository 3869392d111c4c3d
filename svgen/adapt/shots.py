"""The shots stage: both heads, their temperatures and the default head, judged on one HeldOut (docs/fewshot.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import numpy as np
import torch

from svgen import records
from svgen.adapt import heldout, residual, select
from svgen.adapt import lda as linear
from svgen.adapt import shotless
from svgen.adapt import temperatures as held_temperatures
from svgen.adapt.config import AdaptConfig
from svgen.adapt.heldout import HeldOut
from svgen.adapt.select import Score
from svgen.core import logits as logit_kinds
from svgen.core.support import IMAGE, SupportSet
from svgen.heads import calibration, predictor
from svgen.heads.scoring import CLIP_LOGIT_SCALE, MIXTURE
from svgen.state import Calibration, Heads, KernelHead, LdaPart, LinearHead, TextSide
from svgen.steps import Clock

log = logging.getLogger(__name__)


@dataclass
class ShotFit:
    """The calibrated heads, the LDA part of the linear head, the default head and the ``fewshot`` record."""

    heads: Heads
    lda: LdaPart
    default_head: str
    record: dict
    held_out: Optional[tuple] = None   # (kernel, linear probabilities of held-out shots, labels, cosine)
    kernel_kept: bool = True   # whether the kernel head kept the shots' correction (svgen.state.ShotsOutcome)


def adapt(zero_shot: Heads, shots: SupportSet, side: TextSide, tilt_shotless: bool = True, progress: bool = False, *,
          config: AdaptConfig) -> ShotFit:
    """The heads for ``shots`` on ``zero_shot``, the classes without shots tilted (:mod:`svgen.adapt.shotless`)."""
    C, t0 = side.n_classes, time.perf_counter()
    clock = Clock(log, logging.INFO if tilt_shotless else logging.DEBUG)   # the tilt's refits: -vv only
    labels = shots.labels.numpy()
    ev = heldout.evidence(labels, C, config, side.config.seed)   # every choice below is judged on it
    res = residual.fit_residual_head(shots.rows.numpy(), labels, side.prototypes.numpy(), C, ev, config)
    clock.lap("adapt: kernel head, σ and ridge chosen on held-out shots (%s) of %d shots", ev.regime.value, len(shots))
    W, b, lchoice = linear.fit_lda_head(side.prototypes, shots, C, ev, config)
    lin = linear.fit_linear_head(side.prototypes, shots, C, W, b, lchoice, ev, config)
    clock.lap("adapt: linear head (LDA, its shrinkage and α chosen)")
    wall = time.perf_counter() - t0
    heads = Heads(kernel_head(res, zero_shot, shots, C), LinearHead(lin.weight, lin.bias))
    heads.calibration = temperatures(heads, side, shots, res, lin, ev, config)
    clock.lap("adapt: temperatures on held-out scores")
    default, weight, head_choice, held = choose_default_head(heads, side, res, shots, lin, ev, config)
    clock.lap("adapt: default head chosen (held-out top-1; the mixture weight by held-out NLL)")
    tilt = (shotless.fit_tilt(shots, side, lambda part: adapt(zero_shot, part, side, False, config=config),
                              head_choice["mixture_weight"], progress, config=config) if tilt_shotless else None)
    if tilt is not None:   # some classes have no shots: the weight and tilt fitted for them too
        clock.lap("adapt: tilt of the classes without shots (refits)")
        # the mixture carries a tilt at its weight even where that is one head alone (0 or 1)
        default, weight = MIXTURE if tilt.offset else calibration.head_of_weight(tilt.weight), tilt.weight
    offset = tilt.offset if tilt else None
    weight = weight if offset or default == MIXTURE else None
    heads.calibration = dataclasses.replace(heads.calibration, mixture_weight=weight, shotless_offset=offset or None)
    record = records.shots(shots.counts(C), side.classes, zero_shot, res, lchoice, lin, default, head_choice, wall,
                           tilt)
    record["heads_vs_zero_shot"] = tilt.versus if tilt else heldout.shots_record(held, default, weight, config)
    log.info("adapted to %d shots in %.2fs: kernel %s (σ=%.3g, c=%.3g), linear LDA γ=%g κ=%g (LOO error %.3f), α=%s",
             len(shots), wall, "adapted" if res.adopted else "kept zero-shot", res.sigma, res.ridge_c,
             lchoice.shrinkage, lchoice.prior_shots, lchoice.loo_error, lin.record.get("alpha", "none (LDA alone)"))
    return ShotFit(heads, lin.lda, default, record, held, kernel_kept=res.adopted)


def kernel_head(res: residual.ResidualFit, zero_shot: Heads, shots: SupportSet, C: int) -> KernelHead:
    """The adapted kernel head, or where zero-shot was chosen the zero-shot head exactly, the shots kept as rows with
    zero votes. σ as the artifact stores it (float32): a loaded head scores exactly as the fitted one."""
    if res.adopted:
        return KernelHead(torch.from_numpy(res.rows).float(), float(np.float32(res.sigma)),
                          torch.from_numpy(res.votes).float(), torch.from_numpy(res.labels).to(torch.int64),
                          torch.full((res.rows.shape[0],), IMAGE, dtype=torch.uint8), CLIP_LOGIT_SCALE)
    z, support = zero_shot.kernel, SupportSet.from_text(zero_shot.kernel.rows).join(shots)
    return KernelHead(support.rows.float(), float(z.bandwidth), torch.cat([z.votes.float(), torch.zeros(len(shots), C)]),
                      support.labels, support.source)


def choose_default_head(heads: Heads, side: TextSide, res, shots: SupportSet, lin, ev: HeldOut,
                        config: AdaptConfig) -> tuple:
    """(head, w, record, (p_kernel, p_linear, y, p_cosine)) by ``CHOICES["default_head"]`` on the calibrated heads'
    probabilities at the scored shots: the mixture at the w of the lowest held-out NLL unless another head is ahead of
    it on held-out top-1 (then w is 1 or 0)."""
    cal, truth, x = heads.calibration, ev.labels, shots.rows[ev.rows].float()
    if res.adopted:
        z = logit_kinds.kernel_logits(torch.as_tensor(res.held_scores, dtype=torch.float64), cal.kernel_logits,
                                      torch.from_numpy(res.held_prior), cal.kernel_floor)
        pk = calibration.softmax(z, cal.temperatures["kernel"]).numpy()
    else:
        pk = predictor.proba(heads, side.prototypes, side.config.kernel, x, "kernel").numpy()
    pl = calibration.softmax(torch.as_tensor(lin.held_logits, dtype=torch.float64), cal.temperatures["linear"]).numpy()
    p0 = predictor.proba(heads, side.prototypes, side.config.kernel, x, "cosine").numpy()
    fit = held_temperatures.fit_weight(pk, pl, truth)
    w = fit["weight"]
    probs = {MIXTURE: calibration.mix(w, pk, pl), "kernel": pk, "linear": pl}
    incumbent = calibration.head_of_weight(w)
    choice, near = top1_check(probs, p0, truth, incumbent, config.level)
    accuracy = {h: float((p.argmax(axis=1) == truth).mean()) for h, p in probs.items()}
    record = records.head_choice(fit, accuracy, ev, incumbent, choice, near)
    return choice.chosen, {"kernel": 1.0, "linear": 0.0}.get(choice.chosen, w), record, (pk, pl, truth, p0)


def top1_check(probs: dict, p_cosine: np.ndarray, truth: np.ndarray, incumbent: str, level: float) -> tuple:
    """(choice, each head's top-1 agreement with zero-shot's): ``CHOICES["default_head"]`` on held-out probabilities
    ({head: M×C}) from the ``incumbent`` (the head the NLL weight picks)."""
    near = {h: float((p.argmax(axis=1) == p_cosine.argmax(axis=1)).mean()) for h, p in probs.items()}
    others = sorted((h for h in ("kernel", "linear") if h != incumbent), key=lambda h: -near[h])   # stable on ties
    scores = {h: dict.fromkeys((Score.TOP1, Score.TOP5, Score.NLL), probs[h]) for h in (incumbent, *others)}
    return select.choose(scores, SimpleNamespace(labels=truth), "default_head", level), near


def temperatures(heads: Heads, side: TextSide, shots: SupportSet, res, lin, ev: HeldOut,
                 config: AdaptConfig) -> Calibration:
    """Both heads' T by the NLL of their held-out logits (the kernel head's logit kind too); the text rule's beside."""
    text_cal = predictor.text_calibration(heads, side.prototypes, side.per_template, side.config.kernel, config=config)
    text_temps = dict(text_cal.temperatures)
    fit = held_temperatures.loo_temperatures({"linear": lin.loo_logits}, lin.loo_labels, fallback=text_temps)
    temps, loo, kind, floor, extra = dict(fit["temperatures"]), dict(fit["loo"]), None, None, {}
    if res.adopted:
        kfit = held_temperatures.choose_kernel_logits(torch.from_numpy(res.held_scores), ev.labels,
                                                      text_temps["kernel"], prior=torch.from_numpy(res.held_prior),
                                                      config=config)
        kind, floor, temps["kernel"], loo["kernel"] = kfit["kind"], kfit["floor"], kfit["temperature"], kfit["loo"]
        extra = records.kernel_logits_choice(kfit, ev)
    return predictor.with_temperatures(
        text_cal, temps, method="loo-nll", kernel_logits=kind, kernel_floor=floor, shots=len(shots), loo=loo,
        text_temperatures=text_temps, **extra, rule=records.SHOTS_TEMPERATURES)
