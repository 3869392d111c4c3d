"""The shots stage: the kernel and linear heads with shots, their temperatures and the default head (the mixture of
both, weighted by held-out NLL), as :func:`adapt` returns them with their record (docs/fewshot.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch

from svgen.adapt import temperatures as held_temperatures
from svgen.core import logits as logit_kinds
from svgen.heads import calibration
from svgen.core.support import IMAGE, SupportSet
from svgen.adapt import shotless as coverage
from svgen.adapt import residual
from svgen.adapt import lda as fewshot
from svgen.adapt import heldout
from svgen.heads import predictor
from svgen.heads.scoring import MIXTURE
from svgen.adapt.config import AdaptConfig, config_or_default
from svgen.adapt.heldout import shot_sample
from svgen.state import Calibration, Heads, KernelHead, LdaPart, LinearHead, TextSide
from svgen.steps import Clock

log = logging.getLogger(__name__)


@dataclass
class ShotFit:
    """The shots stage: its heads (calibrated), the LDA part of its linear head, its default head and its record
    (``svgen.json`` ``fewshot``)."""

    heads: Heads
    lda: LdaPart
    default_head: str
    record: dict
    held_out: Optional[tuple] = None   # (kernel, linear probabilities of held-out shots, labels, cosine)
    kernel_kept: bool = True   # whether the kernel head kept the shots' correction (svgen.state.ShotsOutcome)


def adapt(zero_shot: Heads, shots: SupportSet, side: TextSide, tilt_shotless: bool = True,
          progress: bool = False, config: Optional[AdaptConfig] = None) -> ShotFit:
    """The heads for ``shots`` on ``zero_shot``, the classes without shots tilted (:mod:`svgen.adapt.shotless`)."""
    config = config_or_default(config)
    C = side.n_classes
    t0 = time.perf_counter()
    clock = Clock(log, logging.INFO if tilt_shotless else logging.DEBUG)   # the tilt's refits: -vv only
    seed, labels = side.config.seed, shots.labels.numpy()
    res = residual.fit_residual_head(shots.rows.numpy(), labels, side.prototypes.numpy(), C, seed=seed, config=config)
    clock.lap("adapt: kernel head, σ and ridge chosen on held-out folds of %d shots", len(shots))
    W, b, lchoice = fewshot.fit_lda_head(side.prototypes, shots, C, config=config)
    lin = fewshot.fit_linear_head(side.prototypes, shots, C, W, b, lchoice, res.folds, None,
                                 shot_sample(labels, config.lda_loo_max, seed), config=config)
    clock.lap("adapt: linear head (LDA, its shrinkage and α chosen)")
    wall = time.perf_counter() - t0
    if res.adopted:   # σ as the artifact stores it (float32): a loaded head scores exactly as the fitted one
        kernel = KernelHead(torch.from_numpy(res.rows).float(), float(np.float32(res.sigma)),
                            torch.from_numpy(res.votes).float(), torch.from_numpy(res.labels).to(torch.int64),
                            torch.full((res.rows.shape[0],), IMAGE, dtype=torch.uint8), float(res.logit_scale))
    else:   # refused: the zero-shot head exactly, the shots kept as rows with zero votes
        z, support = zero_shot.kernel, SupportSet.from_text(zero_shot.kernel.rows).join(shots)
        kernel = KernelHead(support.rows.float(), float(z.bandwidth),
                            torch.cat([z.votes.float(), torch.zeros(len(shots), C)]), support.labels,
                            support.source)
    heads = Heads(kernel, LinearHead(lin.weight, lin.bias))
    folds = res.held_scores is not None   # the kernel head's evidence: its folds' held-out scores, else LOO
    rows = res.held_rows if folds else np.arange(len(shots)) if res.loo_rows is None else np.asarray(res.loo_rows)
    p0 = residual.prior_probs(residual.unit(shots.rows.numpy()[rows]), residual.unit(side.prototypes.numpy()),
                              res.logit_scale)
    evidence = KernelEvidence(rows, res.held_scores if folds else res.loo_scores, p0,
                              "balanced folds" if folds else "leave-one-out")
    heads.calibration = temperatures(heads, side, shots, res, lin, evidence, config)
    clock.lap("adapt: temperatures on held-out scores")
    default, weight, head_choice, held = choose_default_head(heads, side, res, shots, lin, evidence)
    clock.lap("adapt: default head chosen (mixture weight by held-out NLL)")
    tilt = (coverage.fit_tilt(zero_shot, shots, side, lambda part: adapt(zero_shot, part, side, False, config=config),
                              weight, progress, config) if tilt_shotless else None)
    offset = tilt.offset if tilt else None
    if tilt is not None:   # some classes have no shots: the weight and tilt fitted for them too
        clock.lap("adapt: tilt of the classes without shots (refits)")
        # the mixture carries a tilt at its weight even where that is one head alone (0 or 1)
        default = MIXTURE if offset else calibration.head_of_weight(tilt.weight)
        weight = tilt.weight
    weight = weight if offset or default == MIXTURE else None
    heads.calibration = dataclasses.replace(heads.calibration, mixture_weight=weight, shotless_offset=offset or None)
    counts = shots.counts(C)
    record = {
        "shots": int(counts.sum()), "classes_with_shots": int((counts > 0).sum()),
        "shots_per_class": {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean())},
        "shots_by_class": {name: int(n) for name, n in zip(side.classes, counts) if n},
        "kernel": {"head": "zero-shot probabilities + kernel ridge on their residual" if res.adopted
                   else "zero-shot (the shots' correction was refused)", **res.record},
        "linear": {**lchoice.record(), **lin.record}, "default_head": default, "head_choice": head_choice,
        "text_bandwidth": float(zero_shot.kernel.bandwidth), "wall_time_s": wall,
        **({"classes_without_shots": tilt.record} if tilt else {}),
        # output only (diagnose, eval): every head against zero-shot on the held-out evidence above
        "heads_vs_zero_shot": tilt.versus if tilt else heldout.shots_record(held, default, weight, config),
    }
    log.info("adapted to %d shots in %.2fs: kernel %s (σ=%.3g, c=%.3g), linear LDA γ=%g κ=%g (LOO error %.3f), α=%s",
             len(shots), wall, "adapted" if res.adopted else "kept zero-shot", res.sigma, res.record["ridge_c"],
             lchoice.shrinkage, lchoice.prior_shots, lchoice.loo_error, lin.record.get("alpha", "none (LDA alone)"))
    return ShotFit(heads, lin.lda, default, record, held, kernel_kept=res.adopted)


class KernelEvidence(NamedTuple):
    """The shots the kernel head is judged on (folds' held-out shots, or LOO): indices, scores, p₀ there, name."""

    rows: np.ndarray
    scores: np.ndarray
    prior: np.ndarray
    name: str


def held_out_probabilities(heads: Heads, side: TextSide, res, shots: SupportSet, lin, ev: KernelEvidence) -> tuple:
    """(kernel M×C, linear M×C, rows): both calibrated heads' probabilities on the same held-out shots."""
    cal = heads.calibration
    if res.adopted:
        z = logit_kinds.kernel_logits(torch.as_tensor(ev.scores, dtype=torch.float64), cal.kernel_logits,
                                      torch.from_numpy(ev.prior), cal.kernel_floor)
        pk = calibration.softmax(z, cal.temperatures["kernel"]).numpy()
    else:
        pk = predictor.proba(heads, side.prototypes, side.config.kernel, shots.rows[ev.rows].float(), "kernel").numpy()
    if res.held_scores is not None:   # the same folds, the same order
        zl, rows = lin.held_logits, ev.rows
    else:   # one shot per class: the shots both leave-one-out samples scored
        lin_rows = np.arange(len(shots)) if lin.loo_rows is None else np.asarray(lin.loo_rows)
        rows = np.intersect1d(ev.rows, lin_rows)
        pk, zl = pk[np.searchsorted(ev.rows, rows)], lin.loo_logits[np.searchsorted(lin_rows, rows)]
    pl = calibration.softmax(torch.as_tensor(zl, dtype=torch.float64), cal.temperatures["linear"]).numpy()
    return pk, pl, rows


def choose_default_head(heads: Heads, side: TextSide, res, shots: SupportSet, lin, ev: KernelEvidence) -> tuple:
    """(head, w, record, (p_kernel, p_linear, y, p_cosine)): w minimising the mixture's held-out NLL (1: kernel)."""
    pk, pl, rows = held_out_probabilities(heads, side, res, shots, lin, ev)
    truth = shots.labels.numpy()[rows]
    p0 = predictor.proba(heads, side.prototypes, side.config.kernel, shots.rows[rows].float(), "cosine").numpy()
    fit = held_temperatures.fit_weight(pk, pl, truth)
    w = fit["weight"]
    probs = {"mixture": calibration.mix(w, pk, pl), "kernel": pk, "linear": pl}
    return calibration.head_of_weight(w), w, {
        "mixture_weight": w, "held_out_nll": {h: fit["nll" if h == MIXTURE else f"nll_{h}"] for h in probs},
        "held_out_accuracy": {h: float((p.argmax(axis=1) == truth).mean()) for h, p in probs.items()},
        "shots_compared": fit["images"],
        "evidence": ev.name,
        "classes_compared": "all" if res.loo_rows is None else int(np.unique(truth).size),
        "rule": "w·p_kernel + (1 − w)·p_linear, each head at its own temperature, w minimising the NLL of the "
                "held-out shots (both heads refitted without each fold, on the same classes' shots; one shot per "
                "class: exact leave-one-out); w = 1 is the kernel head alone (ties), w = 0 the linear head alone"}, \
        (pk, pl, truth, p0)


def temperatures(heads: Heads, side: TextSide, shots: SupportSet, res, lin, ev: KernelEvidence,
                 config: Optional[AdaptConfig] = None) -> Calibration:
    """Both heads' T by the NLL of their held-out logits (the kernel head's logit kind too); the text rule's beside."""
    text_cal = predictor.text_calibration(heads, side.prototypes, side.per_template, side.config.kernel, config=config)
    text_temps = dict(text_cal.temperatures)
    fit = held_temperatures.loo_temperatures({"linear": lin.loo_logits}, lin.loo_labels, fallback=text_temps)
    temps, loo, kind, floor, extra = dict(fit["temperatures"]), dict(fit["loo"]), None, None, {}
    if res.adopted:
        kfit = held_temperatures.choose_kernel_logits(torch.from_numpy(ev.scores), shots.labels.numpy()[ev.rows],
                                                fallback=text_temps["kernel"], signed_votes=True,
                                                prior=torch.from_numpy(ev.prior), config=config)
        kind, floor, temps["kernel"], loo["kernel"] = kfit["kind"], kfit["floor"], kfit["temperature"], kfit["loo"]
        extra = {"kernel_logits_choice": {k: v for k, v in kfit.items() if k not in ("temperature", "loo", "floor")},
                 "kernel_evidence": ev.name}
    return predictor.with_temperatures(
        text_cal, temps, method="loo-nll", kernel_logits=kind, kernel_floor=floor, shots=len(shots), loo=loo,
        text_temperatures=text_temps, **extra,
        rule="linear: T minimising the leave-one-out NLL of the shots; an adapted kernel head: T minimising the NLL "
             "of its balanced folds' held-out scores (one shot per class: leave-one-out), for log scores, raw scores "
             "and log scores floored at ε × the zero-shot probability, the lowest NLL kept, log charged for unseen "
             "scores ≤ 0; cosine: CLIP's logit scale 100")
