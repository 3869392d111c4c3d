"""The fitted state of a classifier as plain objects: its heads, their calibration, and which stage made them.

A classifier passes through up to three stages, each producing a complete :class:`Heads`:

* ``zero-shot`` (``svgen fit``): the kernel vote over the generated text support vectors and the text-metric
  linear head;
* ``shots`` (:mod:`svgen.adapt.shots`): labelled images re-solve both heads from the zero-shot ones;
* ``pool`` (:mod:`svgen.adapt.pool`): an unlabelled pool may multiply some heads' probabilities by its class
  likelihood (:class:`PoolFactor`: with shots, the default and linear heads; zero-shot, the kernel head, while the
  linear head is replaced by the transduction's posterior).

:class:`svgen.SVGClassifier` holds the deployed heads (``heads_``), the zero-shot heads the shots were added to
(``zero_shot_``, once there are shots or pool rows), and the inductive heads a pool replaced (``inductive_``), so
adapting again starts from them. What the stages decided is typed here too (:class:`CalibrationMethod`,
:class:`LinearForm`, :class:`LdaChoice`, :class:`ShotsOutcome`, :class:`PoolOutcome`, a pool's :class:`Decision`
and :class:`Reason`, its :class:`Check` and the check's :class:`Gate` of :class:`Paired` means): the ``svgen.json``
records are rendered from these decisions (:mod:`svgen.records`) and never read back to decide; :mod:`svgen.io.codec`
maps an artifact's records to them once, on load. Nothing here computes; the codec turns these objects into an
artifact's tensors and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

import torch

from svgen.core.support import SupportSet


@dataclass
class KernelHead:
    """The kernel vote ``s(x) = k(x, rows) @ votes`` (+ ``softmax(prior_scale · x̂P̂ᵀ)`` with a prior term).

    ``rows``: C×K×D text support vectors (``labels``/``source`` None: row c·K+k is of class c, from text),
    or M×D rows with their class ``labels`` and ``source`` (:data:`svgen.core.support.SOURCES`)."""

    rows: torch.Tensor
    bandwidth: float
    votes: torch.Tensor
    labels: Optional[torch.Tensor] = None
    source: Optional[torch.Tensor] = None
    prior_scale: Optional[float] = None

    def flat_rows(self) -> torch.Tensor:
        """The rows as M×D (text rows C×K×D flattened class by class)."""
        return self.rows.reshape(-1, self.rows.shape[-1])

    def support_set(self) -> SupportSet:
        """The rows as a :class:`~svgen.core.support.SupportSet` (rows, class of each row, source of each row)."""
        return SupportSet.from_text(self.rows) if self.labels is None else SupportSet(self.rows, self.labels, self.source)


@dataclass
class LinearHead:
    """``x̂ Wᵀ + b``."""

    weight: torch.Tensor
    bias: torch.Tensor


class LinearForm(Enum):
    """How the linear head with shots uses its LDA part (the record's ``fewshot.linear.form``)."""

    LDA = "lda"                        # the linear head is the LDA part (one shot per class: no folds to weigh it)
    ZERO_SHOT_PLUS_LDA = "zero-shot + lda"   # W = 100·P̂ + α·s·W_lda, b = α·s·b_lda


@dataclass
class LdaPart:
    """The Gaussian class model the shots fitted (:mod:`svgen.adapt.lda`): its logits ``x̂ Wᵀ + b``, the shrinkage γ
    of its shared covariance, and its leave-one-out NLL temperature on the shots (None: not fitted). The linear head
    with shots adds these logits to the zero-shot ones or is them (``form``); a pool's solve continues them.
    ``equal_radius``: its class means were put at one Mahalanobis radius (every fit since the record's ``means``)."""

    weight: torch.Tensor
    bias: torch.Tensor
    shrinkage: float
    temperature: Optional[float] = None
    form: LinearForm = LinearForm.ZERO_SHOT_PLUS_LDA
    equal_radius: bool = True


@dataclass(frozen=True)
class LdaChoice:
    """How the shots chose the LDA part (:mod:`svgen.adapt.lda`): its shrinkage γ, prior strength κ and their
    leave-one-out error (the record's ``fewshot.linear``), and whether one shot per class fixed them."""

    shrinkage: float
    prior_shots: float
    loo_error: float
    one_shot: bool = False


class CalibrationMethod(Enum):
    """How the temperatures were fitted (the record's ``calibration.method``)."""

    TEXT = "text"                               # the text rule, no labels (svgen.heads.calibration)
    HELD_OUT_NLL = "loo-nll"                    # the NLL of held-out shots (svgen.adapt.shots)
    ENTROPY_MATCHED = "entropy-matched"         # after a pool without labels (svgen.adapt.pool)
    CONFIDENCE_MATCHED = "confidence-matched"   # the same, to the halves' agreement
    GIVEN = "given"                             # set_temperatures with a method of the caller's own

    @classmethod
    def named(cls, method) -> "CalibrationMethod":
        """The member of ``method`` (a member, or a caller's name for it); a name of the caller's own is GIVEN."""
        if isinstance(method, cls):
            return method
        return next((m for m in cls if m.value == method), cls.GIVEN)


@dataclass
class Calibration:
    """Per-head temperatures (``softmax(logits / T)``), the kind of the kernel head's logits
    (:data:`svgen.core.logits.KERNEL_LOGITS`), the weight of the kernel head in the ``"mixture"`` head
    where shots fitted one (:mod:`svgen.adapt.temperatures`), the mixture's log-factor for classes without shots where
    some have none (:mod:`svgen.adapt.shotless`) and the record of how they were fitted (``svgen.json``)."""

    temperatures: dict
    kernel_logits: str = "log"
    record: dict = field(default_factory=dict)
    kernel_floor: Optional[float] = None   # ε of the "floored" kernel logits (None for the other kinds)
    mixture_weight: Optional[float] = None   # w of the "mixture" head, w·p_kernel + (1 − w)·p_linear (None: none)
    shotless_offset: Optional[float] = None  # δ: the mixture's classes without shots × e^δ (svgen.adapt.shotless)
    method: CalibrationMethod = CalibrationMethod.TEXT   # how the temperatures were fitted (record: "method")


@dataclass
class PoolFactor:
    """After a kept pool (:mod:`svgen.adapt.pool`): some heads' probabilities are multiplied by the pool's
    Gaussian class likelihood to a power, ``p_h(x) ∝ p_h⁰(x)·exp(a_h·(x̂ Wᵀ + b))``, where ``p_h⁰`` is the head at its
    own calibration and ``x̂ Wᵀ + b`` the log-likelihood (C×D ``weight``, C ``bias``). With shots ``a_h`` is fitted on
    held-out shots and ``p_h⁰`` is the head as the shots left it; without labels only the kernel head carries it (the
    transduction's posterior with the kernel vote as its prior). ``powers``: head name → ``a_h`` (> 0) for the heads
    it changes; the others are unchanged."""

    weight: torch.Tensor
    bias: torch.Tensor
    powers: dict


@dataclass
class Heads:
    """One stage's complete predictor. ``calibration`` None: not known (the zero-shot heads of an artifact
    that did not store theirs; the text rule recomputes them). ``pool_factor``: a pool's factor on some heads'
    probabilities (None: none)."""

    kernel: KernelHead
    linear: LinearHead
    calibration: Optional[Calibration] = None
    pool_factor: Optional[PoolFactor] = None


@dataclass
class TextSide:
    """What every stage is built on and never changes: the classes, their unit prototypes (C×D) and per-template
    text embeddings (C×T×D), the fit's settings (:class:`svgen.zeroshot.training.FitConfig`) and the rule the stored vote
    weights are scaled by (``"M·λ"`` or none)."""

    classes: list
    prototypes: torch.Tensor
    per_template: torch.Tensor
    config: object
    vote_rule: Optional[str] = None

    @property
    def n_classes(self) -> int:
        return len(self.classes)


class Evidence(Enum):
    """What a pool's check scored it on (the record's ``transductive.check.evidence``)."""

    SHOTS = "held-out shots as pool members"
    HALVES = "halves of the pool"


@dataclass(frozen=True)
class ShotsOutcome:
    """What the shots stage decided: its default head (``kernel``, ``linear`` or ``mixture``) and whether the kernel
    head kept the shots' correction (False: the zero-shot kernel vote, the shots as rows with zero votes)."""

    default_head: str
    kernel_kept: bool = True


@dataclass(frozen=True)
class PoolOutcome:
    """What a pool did: whether it was kept (False: every head is the inductive one), what its check scored
    (None: no check ran) and, kept, the default head it deploys."""

    kept: bool
    evidence: Optional[Evidence] = None
    default_head: Optional[str] = None


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
class Paired:
    """Two predictors on the same images: their (weighted) means, candidate − baseline and its SE, the images."""

    candidate: float
    baseline: float
    difference: float
    standard_error: float
    n: int


@dataclass(frozen=True)
class Gate:
    """The pool (candidate) against the inductive predictor (baseline) paired: top-1, top-5, NLL (halves: None)."""

    top1: Paired
    top5: Paired
    level: float
    nll: Optional[Paired] = None
    gained: int = 0
    lost: int = 0
    failed: tuple = ()

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
            return Decision(True, Reason.KEPT, self)
        failed = Reason.SHOTS_CHECK_FAILED if self.evidence is Evidence.SHOTS else Reason.HALVES_CHECK_FAILED
        return Decision(False, failed, self, self.gate.message)


@dataclass(frozen=True)
class Decision:
    """A pool kept or refused, why, on what (its :class:`Check`; rendered by
    :func:`svgen.records.decision`)."""

    kept: bool
    reason: Reason
    evidence: Any = None
    why: Optional[str] = None


def refuse(reason: Reason, why: str, check=None) -> Decision:
    if reason is Reason.KEPT or not why:
        raise ValueError(f"inconsistent refusal: reason={reason}, why={why!r}")
    return Decision(False, reason, check, why)


KEPT = Decision(True, Reason.KEPT)


def pool_outcome(decision: Decision, default_head: Optional[str]) -> PoolOutcome:
    """What a pool did, typed: kept or not, on which evidence, and kept, the default head it deploys. A loaded
    artifact's comes from its record instead (:mod:`svgen.io.recorded`)."""
    check = decision.evidence
    return PoolOutcome(decision.kept, None if check is None else check.evidence,
                       default_head if decision.kept else None)
