"""Labelled images ("shots") added to the zero-shot heads: the ``shots`` stage (:mod:`svgen.state`).

:func:`adapt` takes the zero-shot :class:`~svgen.state.Heads`, all the shots and the :class:`~svgen.state.TextSide`
and returns new heads and their record (``svgen.json`` ``fewshot``); it changes nothing it is given.

* **Kernel head**: zero-shot probabilities plus kernel ridge on their residual (:mod:`svgen.fewshot.residual`: σ and c
  on balanced held-out folds; zero-shot kept where the correction is worse there).
* **Linear head**: CLIP's zero-shot logits plus α × the shared-covariance LDA head's (:mod:`svgen.fewshot.linear`;
  the LDA head, :func:`svgen.fewshot.lda.fit_lda_head`, has the prototypes as prior means; α on the same folds).
* **Default head**: the mixture of the two calibrated heads, ``w·p_kernel + (1 − w)·p_linear``, with ``w`` by the NLL of
  the same held-out shots (:func:`choose_default_head`; ``w`` = 1 or 0: that head alone).
* **Temperatures**: fitted on held-out scores of the shots (:func:`temperatures`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from svgen.calibration import mixture
from svgen.calibration import temperatures as calibration
from svgen.fewshot import coverage
from svgen.fewshot import lda as fewshot
from svgen.fewshot import linear
from svgen.heads import predictor
from svgen.fewshot import residual
from svgen.heads.scoring import MIXTURE
from svgen.state import Calibration, Heads, KernelHead, LinearHead, TextSide
from svgen.core.support import IMAGE, SupportSet
from svgen.heads import heldout
from svgen.steps import Clock

log = logging.getLogger(__name__)


@dataclass
class ShotFit:
    """The shots stage: its heads (calibrated) and its record (``svgen.json`` ``fewshot``)."""

    heads: Heads
    record: dict
    # (kernel M×C, linear M×C calibrated probabilities of held-out shots, M labels, cosine M×C probabilities)
    held_out: Optional[tuple] = None


def adapt(zero_shot: Heads, shots: SupportSet, side: TextSide, tilt_shotless: bool = True,
          progress: bool = False) -> ShotFit:
    """The heads for ``shots`` (every image shot, earlier ones included) on top of ``zero_shot``. Where some classes
    have no shots, the default head is the mixture with those classes tilted, its weight and offset as
    :func:`svgen.fewshot.coverage.fit_tilt` fits them (``tilt_shotless=False``: not, as in that fit's own refits;
    ``progress``: a progress bar over its refits)."""
    C = side.n_classes
    t0 = time.perf_counter()
    clock = Clock(log, logging.INFO if tilt_shotless else logging.DEBUG)   # the tilt's refits: -vv only
    res = residual.fit_residual_head(shots.rows.numpy(), shots.labels.numpy(), side.prototypes.numpy(), C,
                                     seed=side.config.seed)
    clock.lap("adapt: kernel head, σ and ridge chosen on held-out folds of %d shots", len(shots))
    W, b, lchoice = fewshot.fit_lda_head(side.prototypes, shots, C)
    lin = linear.fit_linear_head(side.prototypes, shots, C, W, b, lchoice.settings, res.folds, None,
                                 residual.shot_sample(shots.labels.numpy(), fewshot.LDA_LOO_MAX, side.config.seed))
    clock.lap("adapt: linear head (LDA, its shrinkage and α chosen)")
    wall = time.perf_counter() - t0
    heads = Heads(kernel_head(res, zero_shot, shots, C), LinearHead(lin.weight, lin.bias))
    evidence = kernel_evidence(res, shots, side)
    heads.calibration = temperatures(heads, side, shots, res, lin, evidence)
    clock.lap("adapt: temperatures on held-out scores")
    default, weight, head_choice, held = choose_default_head(heads, side, res, shots, lin, evidence)
    clock.lap("adapt: default head chosen (mixture weight by held-out NLL)")
    heads.calibration = dataclasses.replace(heads.calibration, mixture_weight=weight)
    tilt = (coverage.fit_tilt(zero_shot, shots, side, lambda part: adapt(zero_shot, part, side, False),
                              head_choice["mixture_weight"], progress) if tilt_shotless else None)
    if tilt is not None:
        clock.lap("adapt: tilt of the classes without shots (refits)")
    without = None
    if tilt is not None:   # some classes have no shots: the weight and tilt fitted for them too
        weight, offset, without = tilt
        # the mixture carries a tilt at its weight even where that is one head alone (0 or 1)
        default = MIXTURE if offset else mixture.head_of_weight(weight)
        heads.calibration = dataclasses.replace(
            heads.calibration, mixture_weight=weight if offset or default == MIXTURE else None,
            shotless_offset=offset or None)
    counts = shots.counts(C)
    record = {
        "shots": int(counts.sum()), "classes_with_shots": int((counts > 0).sum()),
        "shots_per_class": {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean())},
        "shots_by_class": {name: int(n) for name, n in zip(side.classes, counts) if n},
        "kernel": {"head": "zero-shot probabilities + kernel ridge on their residual" if res.adopted
                   else "zero-shot (the shots' correction was refused)", **res.record},
        "linear": {**lchoice.as_dict(), **lin.record}, "default_head": default, "head_choice": head_choice,
        "text_bandwidth": float(zero_shot.kernel.bandwidth), "wall_time_s": wall,
        **({"classes_without_shots": without} if without else {}),
        # output only (diagnose, eval): every head against zero-shot on the held-out evidence above
        "heads_vs_zero_shot": (without.pop("heads_vs_zero_shot", None) if without
                               else heldout.shots_record(held, default, weight)),
    }
    log.info("adapted to %d shots in %.2fs: kernel %s (σ=%.3g, c=%.3g), linear LDA γ=%g κ=%g (LOO error %.3f), α=%s",
             len(shots), wall, "adapted" if res.adopted else "kept zero-shot", res.sigma, res.record["ridge_c"],
             lchoice.settings["shrinkage"], lchoice.settings["prior_shots"], lchoice.loo_error,
             lin.record.get("alpha", "none (LDA alone)"))
    return ShotFit(heads, record, held)


def kernel_head(res, zero_shot: Heads, shots: SupportSet, n_classes: int) -> KernelHead:
    """The kernel head from a :class:`svgen.fewshot.residual.ResidualFit`: its rows and votes with the zero-shot prior
    term when it was adopted, else the zero-shot kernel vote over the text rows exactly (the shots follow as rows
    with zero votes, so adapting again or adding classes still has them)."""
    if res.adopted:
        # σ as the artifact stores it (float32), so a saved and loaded head scores exactly as the fitted one
        return KernelHead(torch.from_numpy(res.rows).float(), float(np.float32(res.sigma)),
                          torch.from_numpy(res.votes).float(),
                          torch.from_numpy(res.labels).to(torch.int64),
                          torch.full((res.rows.shape[0],), IMAGE, dtype=torch.uint8), float(res.logit_scale))
    z = zero_shot.kernel
    rows = SupportSet.from_text(z.rows).join(shots)   # the shots kept as rows with zero votes
    return KernelHead(rows.rows.float(), float(z.bandwidth),
                      torch.cat([z.votes.float(), torch.zeros(len(shots), n_classes)]), rows.labels, rows.source)


@dataclass
class KernelEvidence:
    """The shots the adapted kernel head is judged on (its temperature, the mixture's weight): the balanced folds'
    held-out shots, the head refitted without each fold at its chosen settings, or with one shot per class (no
    folds) every scored shot left out exactly."""

    rows: np.ndarray        # indices into the shots
    scores: np.ndarray      # the kernel head's scores on them (``res.held_scores`` or ``res.loo_scores``)
    prior: np.ndarray       # its zero-shot term p₀ at them (the "floored" kind's floor)
    name: str               # "balanced folds" | "leave-one-out"


def kernel_evidence(res, shots: SupportSet, side: TextSide) -> KernelEvidence:
    """:class:`KernelEvidence` of a :class:`svgen.fewshot.residual.ResidualFit`."""
    if res.held_scores is not None:
        rows, scores, name = res.held_rows, res.held_scores, "balanced folds"
    else:
        rows = np.arange(len(shots)) if res.loo_rows is None else np.asarray(res.loo_rows)
        scores, name = res.loo_scores, "leave-one-out"
    p0 = residual.prior_probs(residual.unit(shots.rows.numpy()[rows]), residual.unit(side.prototypes.numpy()),
                              res.logit_scale)
    return KernelEvidence(rows, scores, p0, name)


def held_out_probabilities(heads: Heads, side: TextSide, res, shots: SupportSet, lin, ev: KernelEvidence) -> tuple:
    """(kernel M×C, linear M×C, rows): both calibrated heads' probabilities on the same M shots, which neither saw —
    the kernel head's ``ev.scores`` and the linear head's logits (``lin.held_logits`` on the folds,
    ``lin.loo_logits`` with one shot per class): the evidence the temperatures in ``heads.calibration`` were fitted
    on; ``rows`` are those shots (indices into all shots). With one shot per class each head's leave-one-out may
    score a different sample of shots (the kernel head's :data:`~svgen.fewshot.select.SELECT_MAX`, the LDA head's
    :data:`~svgen.fewshot.lda.LDA_LOO_MAX`, both :func:`svgen.fewshot.select.shot_sample`), and the shots both left
    out are used. A refused kernel correction is the zero-shot kernel head, which needs no refit."""
    cal = heads.calibration
    if res.adopted:
        z = calibration.kernel_logits(torch.as_tensor(ev.scores, dtype=torch.float64), cal.kernel_logits,
                                      torch.from_numpy(ev.prior), cal.kernel_floor)
        pk = calibration.softmax(z, cal.temperatures["kernel"]).numpy()
    else:
        pk = predictor.proba(heads, side.prototypes, side.config.kernel, shots.rows[ev.rows].float(), "kernel").numpy()
    if res.held_scores is not None:   # the same folds' held-out shots, in the same order
        zl, rows = lin.held_logits, ev.rows
    else:
        lin_rows = np.arange(len(shots)) if lin.loo_rows is None else np.asarray(lin.loo_rows)
        rows = np.intersect1d(ev.rows, lin_rows)
        pk = pk[np.searchsorted(ev.rows, rows)]
        zl = lin.loo_logits[np.searchsorted(lin_rows, rows)]
    pl = calibration.softmax(torch.as_tensor(zl, dtype=torch.float64), cal.temperatures["linear"]).numpy()
    return pk, pl, rows


def choose_default_head(heads: Heads, side: TextSide, res, shots: SupportSet, lin, ev: KernelEvidence) -> tuple:
    """(``"mixture"`` | ``"kernel"`` | ``"linear"``, w, record, (p_kernel, p_linear, y, p_cosine)): the head ``classify``,
    ``eval``, ``export`` and ``predict`` use, the mixture's weight (None where it is one head alone), and both heads'
    held-out probabilities of the shots with classes ``y`` that decided it.

    The mixture ``w·p_kernel + (1 − w)·p_linear`` (:mod:`svgen.calibration.mixture`) has ``w`` minimising the NLL of
    both calibrated heads on the same held-out shots (:func:`held_out_probabilities`); ``w = 1`` deploys the kernel
    head alone (a tie keeps it) and ``w = 0`` the linear head alone. Each head is refitted without each fold at its
    chosen settings on every other shot of every class, as it will be deployed, each held-out shot scored against
    all classes, and zero-shot is a candidate inside both (a refused correction; α = 0)."""
    pk, pl, rows = held_out_probabilities(heads, side, res, shots, lin, ev)
    truth = shots.labels.numpy()[rows]
    p0 = predictor.proba(heads, side.prototypes, side.config.kernel, shots.rows[rows].float(), "cosine").numpy()
    fit = mixture.fit_weight(pk, pl, truth)
    w = fit["weight"]
    head = mixture.head_of_weight(w)
    acc = lambda p: float((p.argmax(axis=1) == truth).mean())   # noqa: E731
    mixed = mixture.mix(w, pk, pl)
    return head, (None if head != "mixture" else w), {
        "mixture_weight": w, "held_out_nll": {"mixture": fit["nll"], "kernel": fit["nll_kernel"],
                                              "linear": fit["nll_linear"]},
        "held_out_accuracy": {"mixture": acc(mixed), "kernel": acc(pk), "linear": acc(pl)},
        "shots_compared": fit["images"],
        "evidence": ev.name,
        "classes_compared": "all" if res.loo_rows is None else int(np.unique(truth).size),
        "rule": "w·p_kernel + (1 − w)·p_linear, each head at its own temperature, w minimising the NLL of the "
                "held-out shots (both heads refitted without each fold, on the same classes' shots; one shot per "
                "class: exact leave-one-out); w = 1 is the kernel head alone (ties), w = 0 the linear head alone"}, \
        (pk, pl, truth, p0)


def temperatures(heads: Heads, side: TextSide, shots: SupportSet, res, lin, ev: KernelEvidence) -> Calibration:
    """The kernel and linear heads' temperatures fitted by NLL on held-out scores of the shots
    (:func:`svgen.calibration.temperatures.loo_temperatures`); the cosine head keeps CLIP's scale (T = 1).

    The linear head's T comes from its exact leave-one-out logits (:class:`svgen.fewshot.linear.LinearFit`: the
    deployed head's LDA part left out shot by shot; a fold's LDA head can differ from the deployed one, at 2
    shots per class by having no within-class scatter). An adapted kernel head's kind of logits and T come from its
    balanced folds' held-out scores (the predictor as deployed, refitted without each fold at the chosen settings:
    the evidence its settings were chosen on), through :func:`svgen.calibration.temperatures.choose_kernel_logits`.
    Exact LOO scores (:func:`svgen.fewshot.residual.loo_scores`) leave the held-out image's class one shot short of
    every other class; at 2 shots a class with one shot against classes with two, a softer T than the deployed
    kernel head needs (dev data, 2 shots: query NLL 0.01–0.07 lower with the folds' T). With one shot per class
    there are no folds: the LOO scores, which describe images of a class without shots. A refused correction keeps
    the zero-shot kernel head with the text rule. The text rule's temperatures are recorded next to them."""
    text_cal = predictor.text_calibration(heads, side.prototypes, side.per_template, side.config.kernel)
    text_temps = dict(text_cal.temperatures)
    y = shots.labels.numpy()
    fit = calibration.loo_temperatures({"linear": lin.loo_logits}, lin.loo_labels, fallback=text_temps)
    temps, loo, kind, floor, choice, evidence = dict(fit["temperatures"]), dict(fit["loo"]), None, None, None, {}
    if res.adopted:
        # the kind and T by the guarded NLL (both kinds) on the balanced folds' held-out scores (the deployed
        # predictor, each class one shot short at once); with one shot per class, on the exact LOO scores
        kfit = calibration.choose_kernel_logits(torch.from_numpy(ev.scores), y[ev.rows], fallback=text_temps["kernel"],
                                                signed_votes=True, prior=torch.from_numpy(ev.prior))
        kind, floor, temps["kernel"], loo["kernel"] = kfit["kind"], kfit["floor"], kfit["temperature"], kfit["loo"]
        choice = {k: v for k, v in kfit.items() if k not in ("temperature", "loo", "floor")}
        evidence = {"kernel_evidence": ev.name}
    return predictor.with_temperatures(
        text_cal, temps, method="loo-nll", kernel_logits=kind, kernel_floor=floor, shots=len(shots), loo=loo,
        text_temperatures=text_temps,
        **({"kernel_logits_choice": choice} if choice is not None else {}), **evidence,
        rule="linear: T minimising the leave-one-out NLL of the shots; an adapted kernel head: T minimising the NLL "
             "of its balanced folds' held-out scores (one shot per class: leave-one-out), for log scores, raw scores "
             "and log scores floored at ε × the zero-shot probability, the lowest NLL kept, log charged for unseen "
             "scores ≤ 0; cosine: CLIP's logit scale 100")
