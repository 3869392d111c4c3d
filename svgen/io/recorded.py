"""An artifact's ``svgen.json`` records mapped to the typed fields of the state (:mod:`svgen.state`), once, on load:
the one place a record's values are read to decide anything (``tests/test_records.py``). What the code writes is
rendered from those fields (:mod:`svgen.records`).

Every mapping reads identifiers and structure, never prose, so rewording a record's sentences changes nothing: a head
name, ``calibration.method``'s name, ``fewshot.kernel.decision.adopted``, whether ``transductive.fallback`` holds a
cause, whether ``fewshot.linear.form`` is ``"lda"`` and whether ``fewshot.linear.means`` is recorded at all (every fit
since that key existed put its means at one Mahalanobis radius; none before did). The pool check's evidence is its
recorded name where it is one of :class:`~svgen.state.Evidence`'s, else what the check's numbers are (held-out shots
have an NLL; halves have an agreement).
"""

from __future__ import annotations

from typing import Optional

from svgen.state import CalibrationMethod, Evidence, LinearForm, PoolOutcome, ShotsOutcome


def method(record: Optional[dict]) -> CalibrationMethod:
    """The calibration method of a ``calibration`` record (absent: the text rule, all there was before it)."""
    return CalibrationMethod.named((record or {}).get("method", CalibrationMethod.TEXT.value))


def shots(fewshot: Optional[dict]) -> Optional[ShotsOutcome]:
    """What the shots decided, from ``svgen.json`` ``fewshot`` (None: no shots)."""
    if not fewshot:
        return None
    decision = (fewshot.get("kernel") or {}).get("decision") or {}
    return ShotsOutcome(fewshot.get("default_head") or "kernel", bool(decision.get("adopted", True)))


def pool(transductive: Optional[dict]) -> Optional[PoolOutcome]:
    """What a pool did, from ``svgen.json`` ``transductive`` (None: no pool): kept where no ``fallback`` cause is
    recorded, on the check's evidence, with the default head a kept pool recorded."""
    if not transductive:
        return None
    kept = not transductive.get("fallback")
    return PoolOutcome(kept, evidence(transductive.get("check")), transductive.get("default_head") if kept else None)


def evidence(check: Optional[dict]) -> Optional[Evidence]:
    """What a recorded pool check scored (None: no check ran)."""
    if not check:
        return None
    named = {e.value: e for e in Evidence}.get(check.get("evidence"))
    if named is not None:
        return named
    if "nll" in check or "named_heads" in check:
        return Evidence.SHOTS
    if "agreement_pool" in check:
        return Evidence.HALVES
    return None


def linear_form(linear: Optional[dict]) -> LinearForm:
    """How the shots' linear head used its LDA part (``fewshot.linear.form``; absent: the LDA head alone)."""
    form = (linear or {}).get("form", LinearForm.LDA.value)
    return LinearForm.LDA if form == LinearForm.LDA.value else LinearForm.ZERO_SHOT_PLUS_LDA


def equal_radius(linear: Optional[dict]) -> bool:
    """Whether the LDA part's means are at one Mahalanobis radius (``fewshot.linear.means`` recorded)."""
    return (linear or {}).get("means") is not None


def lda_temperature_fitted(fewshot: Optional[dict], calibration: Optional[dict]) -> bool:
    """Whether an artifact written before the LDA part was stored fitted its temperature on the shots: with the
    zero-shot logits added, ``fewshot.linear.lda_temperature_fitted``; the LDA head alone, its linear temperature by
    leave-one-out NLL."""
    lin = (fewshot or {}).get("linear") or {}
    if linear_form(lin) is LinearForm.ZERO_SHOT_PLUS_LDA:
        return bool(lin.get("lda_temperature_fitted"))
    fitted = ((calibration or {}).get("loo") or {}).get("linear") or {}
    return method(calibration) is CalibrationMethod.HELD_OUT_NLL and bool(fitted.get("fitted"))
