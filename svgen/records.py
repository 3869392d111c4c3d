"""The ``svgen.json`` adaptation records, rendered from the decisions: records go out, and are never read back to
decide anything (:mod:`svgen.io.recorded` maps an artifact's records to the typed fields once, on load;
``tests/test_records.py`` forbids reading them anywhere else).

Rendered here, and nowhere else: the ``calibration``, ``lda`` and ``kernel_prior`` blocks, and the ``fewshot`` and
``transductive`` records — each choice's evidence, its rule in words and the decided fields. The stages
(:mod:`svgen.adapt`) pass their typed decisions (a pool's :class:`~svgen.state.Check`, a
:class:`~svgen.state.Decision`, …); this module reads them by attribute and imports nothing from the stages, so
it sits below them (``tests/test_layout.py``, ``records``).
"""

from __future__ import annotations

import json
from typing import Optional

from svgen.state import Calibration, Evidence, LdaPart, LinearForm, PoolFactor, PoolOutcome, ShotsOutcome

KERNEL_LOGITS_TEXT = {"log": "log(max(score, 1e-30))", "score": "score",
                      "floored": "log(max(score, {floor:g}·prior·max(score)/max(prior), 1e-30)), prior = "
                                 "softmax(logit_scale·x̂P̂ᵀ) (kernel_prior)"}
LINEAR_FORM_TEXT = {LinearForm.LDA: "lda", LinearForm.ZERO_SHOT_PLUS_LDA: "zero-shot logits + α·s·LDA logits"}
KERNEL_PRIOR_SCORES = "softmax(logit_scale · x̂ P̂ᵀ) + exp(-||x̂ - s||²/(2σ²)) @ vote_weights"


def calibration(cal: Calibration, factor: Optional[PoolFactor]) -> dict:
    """``svgen.json`` ``calibration``: how the temperatures were fitted (``cal.record``, written by the stage that
    fitted them) and the deployed calibration's numbers, with how they make probabilities."""
    return {**cal.record, "temperatures": cal.temperatures, "kernel_logits": cal.kernel_logits,
            **({"kernel_floor": cal.kernel_floor} if cal.kernel_floor is not None else {}),
            **({"mixture_weight": cal.mixture_weight} if cal.mixture_weight is not None else {}),
            **({"shotless_offset": cal.shotless_offset} if cal.shotless_offset is not None else {}),
            **({"pool_factor_powers": factor.powers} if factor is not None else {}),
            "probabilities": probabilities(cal, factor)}


def probabilities(cal: Calibration, factor: Optional[PoolFactor]) -> str:
    """The sentence of ``calibration.probabilities``: the deployed heads' probabilities in words."""
    return ("softmax(logits / temperature); logits: kernel "
            + KERNEL_LOGITS_TEXT[cal.kernel_logits].format(floor=cal.kernel_floor)
            + ", linear and cosine their scores"
            + ("" if cal.mixture_weight is None else
               f"; mixture: {cal.mixture_weight:.6g}·p_kernel + {1 - cal.mixture_weight:.6g}·p_linear")
            + ("" if cal.shotless_offset is None else
               f", the classes without an image support vector × exp({cal.shotless_offset:.6g}), renormalised")
            + ("" if factor is None else
               "; after the pool, " + ", ".join(
                   f"{k}: softmax(z + {a:.6g}·(x̂·pool_factor.weightᵀ + pool_factor.bias))"
                   for k, a in factor.powers.items())
               + ", z the head's log-probabilities above (linear: logits / T)"))


def lda(part: LdaPart) -> dict:
    """``svgen.json`` ``lda``: the LDA part's shrinkage and temperature (its logits are the ``lda.*`` tensors)."""
    return {"shrinkage": part.shrinkage, "temperature": part.temperature}


def kernel_prior(scale: float) -> dict:
    """``svgen.json`` ``kernel_prior``: the kernel head's zero-shot prior term."""
    return {"kind": "cosine-softmax", "logit_scale": float(scale), "scores": KERNEL_PRIOR_SCORES}


def fewshot(record: dict, outcome: Optional[ShotsOutcome]) -> dict:
    """``svgen.json`` ``fewshot``: the shots stage's record with its decided default head."""
    return record if outcome is None else {**record, "default_head": outcome.default_head}


def transductive(record: dict, outcome: Optional[PoolOutcome]) -> dict:
    """``svgen.json`` ``transductive``: the pool's record with the default head a kept pool deploys."""
    if outcome is None or not outcome.kept or outcome.default_head is None:
        return record
    return {**record, "default_head": outcome.default_head}


# --- a pool: svgen.json ``transductive`` ---

POOL_RULES = {
    Evidence.SHOTS: "kept if top-1 on the held-out shots (unlabelled pool members) is above the inductive predictor's "
                    "by more than {level:g} SE, and top-5 and NLL are not worse by more than {level:g} SE (paired)",
    Evidence.HALVES: "kept if a head adapted on one half of the pool agrees with the other half's transductive "
                     "posterior (argmax) more often than the inductive head by more than {level:g} SE, and its top 5 "
                     "holds that class not less often by more than {level:g} SE (paired, both directions)"}


def transduced(info: dict, prior_head: str, extra: dict, pr, t_labels: float, wall: float, ic: Calibration) -> dict:
    """A solve kept: its numbers (``info``, the prior ``pr``), the temperatures, and the inductive calibration
    ``ic`` it replaced (adapting again restores it)."""
    inductive = {"temperatures": dict(ic.temperatures), "kernel_logits": ic.kernel_logits,
                 **{k: getattr(ic, k) for k in ("kernel_floor", "mixture_weight") if getattr(ic, k) is not None},
                 "calibration": json.loads(json.dumps(ic.record))}
    return {**info, "fallback": None, "prior_head": prior_head, **extra,
            "prior_temperature": pr.t_prior, "labels_temperature": 1.0 / t_labels,
            "linear_prior_temperature": pr.t_lin, "calibration": "entropy of softmax(100·cos)",
            "posterior_temperature_source": pr.t_post_source,
            "heads": {"linear": "transductive posterior", "kernel": "inductive"}, "wall_time_s": wall,
            "inductive_calibration": inductive}


POOL_FACTOR = "p_head(x) ∝ p_head_inductive(x) · exp(a_head · pool Gaussian log-likelihood(x))"


def fallback(decision) -> Optional[str]:
    """A pool decision's ``fallback``: None when kept, else the cause and that the inductive heads were kept."""
    return None if decision.kept else decision.why + "; kept the inductive heads"


def decision(d) -> dict:
    """A pool :class:`~svgen.state.Decision`'s ``fallback`` and, where a check ran, its ``check`` block."""
    return {"fallback": fallback(d), **({"check": check(d.evidence)} if d.evidence is not None else {})}


def refused(n_pool: int, prior_head: str, d, **extra) -> dict:
    """``transductive`` of a pool refused: its size, the decision (:func:`decision`), the head it would have adapted."""
    return {"pool": n_pool, "fallback": fallback(d), "prior_head": prior_head,
            **({"check": check(d.evidence)} if d.evidence is not None else {}), **extra}


def gate(g) -> dict:
    """A pool check's paired test (:class:`~svgen.state.Gate`): halves without NLL, shots with it."""
    a, out = g.top1, {"images": g.top1.n}
    if g.nll is None:
        out.update(agreement_pool=a.candidate, agreement_inductive=a.baseline, difference=a.difference,
                   standard_error=a.standard_error, gained=g.gained, lost=g.lost,
                   top5_agreement_pool=g.top5.candidate, top5_agreement_inductive=g.top5.baseline)
    else:
        pairs = {"top1": a, "top5": g.top5, "nll": g.nll}
        out.update({k: {"inductive": p.baseline, "pool": p.candidate, "difference": p.difference,
                        "standard_error": p.standard_error} for k, p in pairs.items()})
        out["top1"].update(gained=g.gained, lost=g.lost)
    evidence = Evidence.HALVES if g.nll is None else Evidence.SHOTS
    return {**out, "adopt": g.passed, "reason": g.message, "rule": POOL_RULES[evidence].format(level=g.level)}


def check(c) -> dict:
    """A pool check (:class:`~svgen.state.Check`): its test, or why it stopped before one."""
    base = {"evidence": c.evidence.value, "head": c.head}
    if c.gate is None:
        return {**base, "adopt": False, "reason": c.why}
    out = {**gate(c.gate), **base}
    if c.evidence is Evidence.SHOTS:
        out.update({"powers": dict(c.powers), "cross_fitted": list(c.cross_fitted),
                    "named_heads": {h: gate(g) for h, g in c.named_heads.items()}, "factor": POOL_FACTOR})
    return out


def pool_factor(check_, default: str, powers: dict, heads) -> dict:
    """A pool kept with shots: the check, the default head and each head's factor (the pool's likelihood^a)."""
    kept_none = ("inductive (the held-out shots kept no factor for it: its power is 0, or its own paired check did "
                 "not pass)")
    return {"check": check(check_), "default_head": default,
            "kernel_head": {"replaced": False, "reason": "with shots a pool multiplies the default and linear heads "
                                                        "by its likelihood; the kernel vote is not re-solved"},
            "pool_factor": {"powers": powers,
                            "rule": "p_head(x) ∝ p_head_inductive(x) · exp(a_head · (x̂ W_Gᵀ + b_G)), the pool's "
                                    "Gaussian class log-likelihood (tensors pool_factor.weight, pool_factor.bias); "
                                    "a_head by the NLL of held-out shots that were pool members"},
            "heads": {h: (f"inductive × pool likelihood^{powers[h]:.4g}" if h in powers else
                          "inductive (with shots a pool changes the default and linear heads only)"
                          if h == "kernel" else kept_none) for h in heads if h != "cosine"}}


GUARD_RULE = ("each adapted head's scale is the matched one, or the sharpest below it at which (1 − trust)·KL(p_cosine‖"
              "p_head) ≤ trust·KL(p_head‖p_cosine) on the pool: its expected NLL under trust·p_head + (1 − trust)·"
              "p_cosine is not above the cosine head's")


def posterior_rule(agreement: Optional[float], trust: float) -> str:
    """The calibration rule of a pool kept without labels (matched entropy, or the halves' agreement)."""
    return ("after a pool without labels: T giving each adapted head the inductive default head's mean entropy on "
            "the pool" if agreement is None else
            f"after a pool without labels: T giving each adapted head a mean top-1 probability on the pool of "
            f"{agreement:.4g}, how often a head adapted on one half of the pool predicts the other half's own "
            "posterior class (transductive.check.agreement_pool)") + (
            f"; no sharper than expecting, under the label estimate {trust:g}·p_pool + {1 - trust:.3g}·p_cosine, a "
            "mean NLL on the pool above the cosine head's (transductive.nll_guard)")


def posterior(temps: dict, powers: dict, why: Optional[str], check_, trust: float, guard: dict) -> dict:
    """A pool kept without labels: the heads (the kernel head's factor, or why none), the check, the NLL guard."""
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
               if powers else {}),
            "check": check(check_), "default_head": "linear",
            "nll_guard": {"trust": trust, "reference": "cosine", "heads": guard, "rule": GUARD_RULE}}


def gate_failures(g, top1: bool, top5: bool, nll: bool) -> tuple:
    """A pool check's failures in words (recorded numbers): not ahead on top-1, behind on top-5, behind on NLL."""
    why, level, a, a5, n = [], g.level, g.top1, g.top5, g.nll
    if top1:
        why.append(f"a head adapted on one half of the pool agrees with the other half's own posterior on "
                   f"{100 * a.candidate:.1f}% of it, the inductive head on {100 * a.baseline:.1f}%: the pool's "
                   f"structure does not replicate (not above by more than {level:g} SE)" if n is None else
                   f"top-1 on held-out shots {100 * a.candidate:.1f}% is not above the inductive "
                   f"{100 * a.baseline:.1f}% by more than {level:g} SE ({g.gained} gained, {g.lost} lost)")
    if top5:
        why.append(f"the adapted head's top 5 holds the other half's posterior class on {100 * a5.candidate:.2f}% "
                   f"of it, the inductive head's on {100 * a5.baseline:.2f}%, more often by more than {level:g} SE"
                   if n is None else f"top-5 {100 * a5.candidate:.1f}% is below the inductive "
                   f"{100 * a5.baseline:.1f}% by more than {level:g} SE")
    if nll:
        why.append(f"NLL {n.candidate:.3f} is above the inductive {n.baseline:.3f} by more than {level:g} SE")
    return tuple(why)


# --- the shots: svgen.json ``fewshot`` ---

KERNEL_ONE_SHOT_RULE = ("one shot per class: leave-one-out would leave the image's class without any shot, so it "
                        "cannot judge the correction")


def kernel_decision(kept: bool, p, level: float) -> dict:
    """The correction against zero-shot on the held-out shots, as ``svgen.json`` records it (format 3's text)."""
    out = {"adopted": kept} if p is None else {
        "adopted": kept, "held_out_acc": p.candidate, "zero_shot_acc": p.baseline, "difference": p.difference,
        "standard_error": p.standard_error, "shots_compared": p.n}
    return {**out, "rule": "adapted unless its accuracy on held-out shots (one per class at a time) is below zero-shot's "
                           f"by more than {level:g} SE (paired)"}


def kernel(choice, kept: bool, med, ev, config, logit_scale: float, n_shots: int) -> dict:
    """``fewshot.kernel``: σ, c, how they were chosen (``choice``, on the fit's held-out shots ``ev``), the
    correction against zero-shot."""
    sigma, c = choice.best
    if med is None:
        selection = {"one_shot": True, "rule": f"{'one shot per class' if ev.one_shot else 'every shot is the same image'}"
                     f": σ = 1/√β (Tip-Adapter's β = {config.one_shot_beta:g}), c = {config.one_shot_ridge:g}"
                     f"{' (the shot and the text weigh the same)' if config.one_shot_ridge == 1 else ''}; "
                     "the labels cannot identify either"}
    else:
        selection = {"one_shot": False, "sigma_factor": next(f for f in config.sigma_factors if f * med == sigma),
                     "median_distance": med, "held_out_accuracy": choice.means[choice.best], "folds": len(ev.folds),
                     **({"refits": f"Nyström basis of {config.select_basis} shots, every class"}
                        if n_shots > config.select_max else {}),
                     "rule": "σ (× the median shot distance) and c with the best accuracy on held-out shots (balanced "
                             "folds, the deployed predictor); ties to the larger c, then σ"}
    decision = ({"adopted": True, "rule": KERNEL_ONE_SHOT_RULE} if choice.versus_zero_shot is None
                else kernel_decision(kept, choice.versus_zero_shot, config.level))
    return {"sigma": float(sigma), "ridge_c": float(c), "logit_scale": float(logit_scale), "selection": selection,
            "decision": decision, "shots": int(n_shots), "scored_shots": int(ev.rows.size if ev.one_shot else n_shots)}


def kernel_basis(n_shots: int, dense_max: int, with_votes: int) -> dict:
    """The deployed kernel head's rows: every shot, solved exactly up to ``dense_max`` (``with_votes``: shots voting)."""
    return {"support_rows": int(n_shots),
            "basis": "all shots" if n_shots <= dense_max else f"Nyström, {with_votes} of the shots"}


def kernel_logits_choice(kfit: dict, ev) -> dict:
    """``calibration.kernel_logits_choice`` and ``kernel_evidence``: the kernel head's logit kind as chosen (``kfit``)
    on the held-out shots ``ev``."""
    return {"kernel_logits_choice": {k: v for k, v in kfit.items() if k not in ("temperature", "loo", "floor")},
            "kernel_evidence": ev.regime.value}


def lda_choice(choice) -> dict:
    """``fewshot.linear``'s LDA part: (γ, κ) and their leave-one-out error (an :class:`~svgen.state.LdaChoice`)."""
    return {"loo_error": choice.loo_error, "kind": "lda", "shrinkage": choice.shrinkage,
            "prior_shots": choice.prior_shots, "means": "equal Mahalanobis radius",
            "rule": "one shot per class: Σ = τI and κ = lda_prior_one_shot (LOO cannot judge κ)" if choice.one_shot
            else "the most shrinkage not behind the lowest LOO error (paired), then the lowest LOO error"}


def linear_alone(scale: float) -> dict:
    """``fewshot.linear`` with one shot per class: the LDA head alone."""
    return {"form": "lda", "scale": scale,
            "rule": "one shot per class: no held-out folds to weigh the LDA logits against the zero-shot ones; "
                    "the LDA head"}


def linear(alpha: float, scale: float, fold_scale: float, t_lda: dict, picked, shots_compared: int) -> dict:
    """``fewshot.linear``: zero-shot logits + α·s·LDA logits, α ``picked`` (a :class:`~svgen.adapt.select.Choice`)."""
    return {"form": "zero-shot logits + α·s·LDA logits", "alpha": float(alpha), "scale": scale,
            "fold_scale": fold_scale, "lda_temperature": float(t_lda["temperatures"]["lda"]),
            "lda_temperature_fitted": bool(t_lda["loo"]["lda"]["fitted"]),
            "held_out_accuracy": picked.mean, "zero_shot_held_out_accuracy": picked.means[0.0],
            "grid": {f"{a:g}": v for a, v in picked.means.items()}, "shots_compared": int(shots_compared),
            "rule": "α with the best accuracy on the balanced folds' held-out shots (the LDA head refitted without "
                    "each fold, its logits scaled by fold_scale), ties to the smaller α; a scale is the spread of the "
                    "zero-shot logits / the spread of the LDA logits on shots that head did not see (the deployed "
                    "head's: its exact leave-one-out logits)"}


SHOTS_TEMPERATURES = (
    "linear: T minimising the leave-one-out NLL of the shots; an adapted kernel head: T minimising the NLL of its "
    "balanced folds' held-out scores (one shot per class: leave-one-out), for log scores, raw scores and log scores "
    "floored at ε × the zero-shot probability, the lowest NLL kept, log charged for unseen scores ≤ 0; cosine: CLIP's "
    "logit scale 100")


def versus_zero_shot(images: int, means: dict, versus: dict, worse: dict, level: float) -> dict:
    """``fewshot.heads_vs_zero_shot``: each head's means, its paired differences against zero-shot (``versus``: head →
    metric → :class:`~svgen.state.Paired`) and where it is worse (``worse``: head → metrics)."""
    return {"images": images, "heads": means,
            "versus_zero_shot": {h: {m: {"difference": p.difference, "standard_error": p.standard_error}
                                     for m, p in v.items()} for h, v in versus.items()},
            "worse_than_zero_shot": {h: w for h, w in worse.items() if w},
            "rule": "each head and the cosine head (zero-shot) on the fit's held-out shots, weighed as the fit weighs "
                    "them; a head is worse than zero-shot where its top-1 or top-5 is lower, or its NLL higher, by "
                    f"more than {'one standard error' if level == 1 else f'{level:g} standard errors'} of the paired "
                    "difference"}


DEFAULT_HEAD_RULE = (
    "w·p_kernel + (1 − w)·p_linear, each head at its own temperature, w minimising the NLL of the held-out shots "
    "(w = 1 is the kernel head alone, w = 0 the linear head alone), unless another head is ahead of it on their top-1 "
    "and not behind it on top-5 and NLL (paired, level SE): then that head (docs/adaptation.md, default_head)")


def head_choice(fit: dict, accuracy: dict, ev, incumbent: str, choice, near: dict) -> dict:
    """``fewshot.head_choice``: the mixture weight's fit (``fit``), each head's held-out top-1 (``accuracy``) and the
    ``default_head`` choice from the ``incumbent`` (``near``: each head's top-1 agreement with zero-shot)."""
    return {"mixture_weight": fit["weight"],
            "held_out_nll": {h: fit["nll" if h == "mixture" else f"nll_{h}"] for h in accuracy},
            "held_out_accuracy": accuracy, "shots_compared": fit["images"], "evidence": ev.regime.value,
            "classes_compared": "all" if ev.loo_rows is None or not ev.one_shot else len(set(ev.labels.tolist())),
            "top1_check": {"incumbent": incumbent, "head": choice.chosen, "why": choice.why,
                           "agreement_with_zero_shot": near},
            "rule": DEFAULT_HEAD_RULE}


def kernel_logits_reason(cand: dict, guard: dict, n: int, floor: Optional[float]) -> str:
    """``kernel_logits_choice.reason``: each kind's held-out NLL (``cand``), log's charge (``guard``, of ``n`` shots)."""
    return (f"leave-one-out NLL on the shots: score {cand['score']['nll']:.4g}, log {cand['log']['nll']:.4g} "
            f"+ {guard['charge']:.4g} for true-class votes ≤ 0 on new images (up to {guard['rate_bound']:.3g} "
            f"of them at {guard['loss']:.4g} each; {guard['seen']} of {n} shots showed one)"
            + (f", floored (ε = {floor:g}) {cand['floored']['nll']:.4g}" if "floored" in cand else ""))


def kernel_logits_unfitted(fitted: bool) -> str:
    """``kernel_logits_choice.reason`` where some kind has no finite T: log (``fitted``: at its own T)."""
    return ("under at least one kind every shot is ranked first when left out: its NLL has no finite minimiser, so "
            "the kinds cannot be compared; log" + ("" if fitted else " with the text rule's T"))


def shots(counts, classes, zero_shot, res, lchoice, lin, default, head_choice, wall, tilt) -> dict:
    """``fewshot``: the shots per class, both heads' records, the default head and how it was chosen."""
    return {
        "shots": int(counts.sum()), "classes_with_shots": int((counts > 0).sum()),
        "shots_per_class": {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean())},
        "shots_by_class": {name: int(n) for name, n in zip(classes, counts) if n},
        "kernel": {"head": "zero-shot probabilities + kernel ridge on their residual" if res.adopted
                   else "zero-shot (the shots' correction was refused)", **res.record},
        "linear": {**lda_choice(lchoice), **lin.record}, "default_head": default, "head_choice": head_choice,
        "text_bandwidth": float(zero_shot.kernel.bandwidth), "wall_time_s": wall,
        **({"classes_without_shots": tilt.record} if tilt else {})}


def shotless(n_without: int, offset: float, weight: float, shots_weight: float, nll: dict, folds: list,
             class_folds: int) -> dict:
    """``fewshot.classes_without_shots``: the tilt δ and mixture weight w, their held-out NLL and the refits (``folds``:
    per refit the classes left without shots, their shots, the held-out shots of the others)."""
    return {"classes_without_shots": int(n_without), "offset": float(offset), "mixture_weight": float(weight),
            "mixture_weight_of_the_shots_alone": float(shots_weight), "held_out_nll": nll,
            "folds": [{"classes_left_without_shots": int(g), "their_shots": int(n), "held_out_shots_of_the_others":
                       int(m)} for g, n, m in folds],
            "rule": "w·p_kernel + (1 − w)·p_linear with the classes without shots × e^δ, renormalised; (w, δ), "
                    "w in [0, 1] and δ ≥ 0, minimising the NLL of (a) the shots of each of "
                    f"{len(folds)} groups of 1/{class_folds} of the classes with shots, scored by adapt rerun without "
                    "that group's shots, and (b) that rerun's own held-out shots, weighed by the deployed shares of "
                    "classes without and with shots"}
