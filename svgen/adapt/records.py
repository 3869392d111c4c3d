"""The ``svgen.json`` adaptation records, rendered from the decisions (:mod:`svgen.state`): records go out, and are
never read back to decide anything (:mod:`svgen.io.recorded` maps an artifact's records to the typed fields once, on
load; ``tests/test_records.py`` forbids reading them anywhere else).

Rendered here: the ``calibration`` block (temperatures, the kernel head's logit kind, the mixture and the pool factor,
and the sentence saying how probabilities are computed), the ``lda`` and ``kernel_prior`` blocks, and the decided
fields of the ``fewshot`` and ``transductive`` records (the default head). The rest of those two records — each
choice's evidence and rule — is written by the stage that made the choice (:mod:`svgen.adapt.shots`,
:mod:`svgen.adapt.pool`, :mod:`svgen.adapt.transduce`) and travels unchanged.
"""

from __future__ import annotations

from typing import Optional

from svgen.state import Calibration, LdaPart, LinearForm, PoolFactor, PoolOutcome, ShotsOutcome

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
