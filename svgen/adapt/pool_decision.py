"""Whether a pool is kept, as typed values: a :class:`svgen.adapt.select.Decision`, a :class:`Reason`, a :class:`Check`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from svgen.adapt.config import DEFAULT
from svgen.adapt.select import Decision, Paired
from svgen.state import Evidence, PoolOutcome


class Reason(Enum):
    """Why a pool was kept or refused: one member per exit."""

    KEPT = "kept"
    POOL_TOO_SMALL = "pool too small"
    CLASSES_WITHOUT_SHOTS = "classes without shots"
    NO_HELD_OUT_SHOTS = "no held-out shots"
    FOLD_DID_NOT_ADAPT = "a fold did not adapt"
    HALF_DID_NOT_ADAPT = "a half did not adapt"
    SHOTS_CHECK_FAILED = "held-out shots said no"
    HALVES_CHECK_FAILED = "halves said no"
    DID_NOT_SETTLE = "rounds did not settle"


@dataclass(frozen=True)
class Gate:
    """The pool (candidate) against the inductive predictor (baseline) paired: top-1, top-5, NLL (halves: None)."""

    top1: Paired
    top5: Paired
    nll: Optional[Paired] = None
    gained: int = 0
    lost: int = 0
    failed: tuple = ()
    level: float = DEFAULT.level

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def message(self) -> Optional[str]:
        return "; ".join(self.failed) or None


@dataclass(frozen=True)
class Check:
    """The pool check: its evidence, head, test (``gate``) or why it stopped, and with shots the powers (head → a)."""

    evidence: Evidence
    head: str
    gate: Optional[Gate] = None
    stopped: Optional[Reason] = None
    why: Optional[str] = None
    powers: dict = field(default_factory=dict)
    cross_fitted: tuple = ()
    named_heads: dict = field(default_factory=dict)

    def __post_init__(self):
        if (self.gate is None) == (self.stopped is None):
            raise ValueError("a check has either a test or a reason it stopped before one")

    def decision(self) -> Decision:
        if self.gate is None:
            return refuse(self.stopped, self.why, self)
        if self.gate.passed:
            return Decision(True, Reason.KEPT, self, level=self.gate.level)
        failed = Reason.SHOTS_CHECK_FAILED if self.evidence is Evidence.SHOTS else Reason.HALVES_CHECK_FAILED
        return Decision(False, failed, self, self.gate.message, self.gate.level)


def refuse(reason: Reason, why: str, check: Optional[Check] = None) -> Decision:
    if reason is Reason.KEPT or not why:
        raise ValueError(f"inconsistent refusal: reason={reason}, why={why!r}")
    return Decision(False, reason, check, why)


KEPT = Decision(True, Reason.KEPT)


def pool_outcome(decision: Decision, default_head: Optional[str]) -> PoolOutcome:
    """What a pool did, typed (:class:`svgen.state.PoolOutcome`): kept or not, on which evidence, and kept, the
    default head it deploys. A loaded artifact's comes from its record instead (:mod:`svgen.io.recorded`)."""
    check = decision.evidence
    return PoolOutcome(decision.kept, None if check is None else check.evidence,
                       default_head if decision.kept else None)
