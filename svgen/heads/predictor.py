"""Scores, logits and probabilities of a :class:`svgen.state.Heads` — the one place a head is evaluated.

``scores``: the kernel vote ``k(x̂, rows) @ votes`` (+ ``softmax(100·x̂P̂ᵀ)`` with a prior term), the linear head
``x̂Wᵀ + b`` or CLIP's cosine ``100·x̂P̂ᵀ``; ``logits``: what the softmax takes (the kernel vote's ``log score`` or
raw score, :mod:`svgen.core.logits`); probabilities are ``softmax(logits / T_head)``. With shots the
``"mixture"`` head (:mod:`svgen.heads.calibration`) is ``w·p_kernel + (1 − w)·p_linear``; its scores and logits are
``log max(p, 10⁻³⁰)`` and its T is 1. After a kept pool, a head with a pool factor
(:class:`svgen.state.PoolFactor`) is ``softmax(z⁰ + a·(x̂ W_Gᵀ + b_G))``, z⁰ the head's calibrated log-probabilities as
the shots left it (the linear head's ``logits / T``, the others' ``log max(p, 10⁻³⁰)``); its scores and logits are
that sum and its T is 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F

from svgen.heads import calibration
from svgen.core import logits as logit_kinds
from svgen.errors import SvgenError
from svgen.heads.scoring import HEADS, MIXTURE, cosine_logits, kernel_scores, linear_logits, prior_probs
from svgen.state import Calibration, CalibrationMethod, Heads
from svgen.core.support import IMAGE


def head_names(heads: Heads) -> tuple:
    """The heads ``heads`` can be read through: :data:`~svgen.heads.scoring.HEADS`, and ``"mixture"`` where shots
    fitted its weight."""
    cal = heads.calibration
    return HEADS + ((MIXTURE,) if cal is not None and cal.mixture_weight is not None else ())


def to_device(heads: Heads, device) -> Heads:
    """A copy of ``heads`` whose tensors are on ``device`` (every function here scores on its inputs' device)."""
    def move(obj):
        if isinstance(obj, torch.Tensor):
            return obj.to(device)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
        return obj
    return move(heads)


def check_head(heads: Heads, head: str) -> str:
    """``head`` if ``heads`` has it, else one :class:`SvgenError` line."""
    if head in head_names(heads):
        return head
    if head == MIXTURE:
        raise SvgenError("this classifier has no mixture head: only a fit with labelled shots has one, where the "
                         "kernel head's weight fitted on held-out shots is strictly between 0 and 1 (at 0 or 1 the "
                         "linear or the kernel head alone is the default; svgen.json fewshot.head_choice)")
    raise SvgenError(f"unknown head {head!r}; expected one of {', '.join(head_names(heads))}")


def temperature(heads: Heads, head: str) -> float:
    """``head``'s T (the mixture's, and a head with a pool factor's, is 1: their parts are calibrated)."""
    return 1.0 if head == MIXTURE or pool_power(heads, head) is not None else heads.calibration.temperatures[head]


def pool_power(heads: Heads, head: str) -> Optional[float]:
    """The power ``a`` of the pool's factor on ``head``'s probabilities (:class:`svgen.state.PoolFactor`), or None."""
    f = heads.pool_factor
    return None if f is None else f.powers.get(head)


def pool_log_likelihood(heads: Heads, x: torch.Tensor) -> torch.Tensor:
    """N×C (float64): the pool's Gaussian class log-likelihood ``x̂ W_Gᵀ + b_G`` at rows ``x`` (the factor's)."""
    return gaussian_log_likelihood(heads.pool_factor.weight, heads.pool_factor.bias, x)


def gaussian_log_likelihood(W: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """N×C (float64): ``x̂ Wᵀ + b`` with x̂ = x/‖x‖, a transduction's Gaussian class log-likelihood (C×D ``W``, C ``b``)."""
    return F.normalize(x.double(), dim=-1) @ W.double().T + b.double()


def _factored_logits(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str) -> torch.Tensor:
    """``z⁰ + a·(x̂ W_Gᵀ + b_G)`` (float64) for a head with a pool factor (the module text)."""
    x = x.float()
    with torch.no_grad():
        if head == "linear":
            base = linear_logits(x, heads.linear.weight, heads.linear.bias).double() / heads.calibration.temperatures[head]
        else:
            base = _base_proba(heads, prototypes, kind, x, head).clamp_min(logit_kinds.KERNEL_LOG_FLOOR).log()
        return base + pool_power(heads, head) * pool_log_likelihood(heads, x)


def mixture_proba(heads: Heads, prototypes, kind: str, x: torch.Tensor) -> torch.Tensor:
    """``w·p_kernel + (1 − w)·p_linear`` (float64), each head at its own temperature; where some classes have no
    shots and the fit tilted them (``calibration.shotless_offset`` δ, :mod:`svgen.adapt.shotless`), those classes'
    probabilities × e^δ, renormalised."""
    check_head(heads, MIXTURE)
    cal = heads.calibration
    p = calibration.mix(cal.mixture_weight, _base_proba(heads, prototypes, kind, x, "kernel"),
                        _base_proba(heads, prototypes, kind, x, "linear"))
    return p if not cal.shotless_offset else calibration.tilt(p, cal.shotless_offset, shotless_classes(heads))


def class_log_factor(heads: Heads) -> torch.Tensor:
    """C: the mixture's log-factor of each class, δ (``calibration.shotless_offset``) for the classes without shots
    and 0 for the others (all 0 where the fit tilted none)."""
    return (heads.calibration.shotless_offset or 0.0) * shotless_classes(heads).double()


def shotless_classes(heads: Heads) -> torch.Tensor:
    """C booleans: the classes with no labelled image among the kernel head's rows (all of them for text rows)."""
    k = heads.kernel
    C = k.votes.shape[1]
    if k.labels is None:
        return torch.ones(C, dtype=torch.bool, device=k.votes.device)
    images = torch.zeros(C, device=k.labels.device).index_add_(0, k.labels.long(), (k.source == IMAGE).float())
    return images == 0


def tie(values: torch.Tensor, twins: Optional[torch.Tensor]) -> torch.Tensor:
    """N×C ``values`` with each class's column replaced by its first twin's (``twins``:
    :func:`svgen.validation.twin_classes`; None: ``values`` as they are). Twins' scores computed apart differ in
    their last bits (sums taken in another order), so which of them wins would be noise: copied, they tie exactly, and
    the first of them is the one ``argmax`` and ``classify`` pick."""
    return values if twins is None else values.index_select(1, twins.to(values.device))


def scores(heads: Heads, prototypes: torch.Tensor, kind: str, x: torch.Tensor, head: str,
           twins: Optional[torch.Tensor] = None) -> torch.Tensor:
    """N×C scores of one head for checked N×D features ``x`` (``kind``: the kernel, e.g. ``"rbf"``); the
    mixture's are ``log max(p, 10⁻³⁰)`` (float32; the floor of the kernel's log scores, which float32 exports reach).
    ``twins``: classes listed twice score as their first (:func:`tie`)."""
    if pool_power(heads, check_head(heads, head)) is not None:
        return tie(_factored_logits(heads, prototypes, kind, x, head).float(), twins)
    return tie(_base_scores(heads, prototypes, kind, x, head), twins)


def scores_and_logits(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str,
                      twins: Optional[torch.Tensor] = None) -> tuple:
    """(:func:`scores`, :func:`logits`) of one head with the head evaluated once (``svgen eval`` needs both)."""
    if pool_power(heads, check_head(heads, head)) is not None:
        z = tie(_factored_logits(heads, prototypes, kind, x, head), twins)
        return z.float(), z
    s, prior = _scores_and_prior(heads, prototypes, kind, x, head)
    return tie(s, twins), tie(_base_logits(heads, s, head, prior), twins)


def _base_scores(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str) -> torch.Tensor:
    """:func:`scores` without a pool factor: the head as the shots left it."""
    if head == MIXTURE:
        return mixture_proba(heads, prototypes, kind, x).clamp_min(logit_kinds.KERNEL_LOG_FLOOR).log().float()
    with torch.no_grad():
        if head == "kernel":
            k = heads.kernel
            s = kernel_scores(x, k.rows, k.bandwidth, k.votes, kind)
            return s if k.prior_scale is None else s + prior_probs(x, prototypes, k.prior_scale)
        if head == "linear":
            return linear_logits(x, heads.linear.weight, heads.linear.bias)
        return cosine_logits(x, prototypes)   # check_head has let only the cosine head through


def scores_in_blocks(heads: Heads, prototypes, kind: str, U: torch.Tensor, head: str, block: int = 8192) -> torch.Tensor:
    """N×C float32 scores in row blocks (a kernel head's N×M kernel never whole)."""
    return torch.cat([scores(heads, prototypes, kind, U[s:s + block], head).float() for s in range(0, U.shape[0], block)])


def proba_in_blocks(heads: Heads, prototypes, kind: str, U: torch.Tensor, head: str, block: int = 8192) -> torch.Tensor:
    """N×C float32 probabilities (:func:`proba`) in row blocks."""
    return torch.cat([proba(heads, prototypes, kind, U[s:s + block], head).float() for s in range(0, U.shape[0], block)])


def kernel_prior(heads: Heads, prototypes, x: torch.Tensor) -> Optional[torch.Tensor]:
    """The kernel head's zero-shot prior term ``softmax(τ·x̂P̂ᵀ)`` at ``x`` (None: the head has none)."""
    k = heads.kernel
    if k.prior_scale is None:
        return None
    with torch.no_grad():
        return prior_probs(x, prototypes, k.prior_scale)


def logits_of_scores(heads: Heads, s: torch.Tensor, head: str, prior=None) -> torch.Tensor:
    """What the head's softmax takes, from its scores ``s``; ``prior``: the kernel head's zero-shot term at the same
    images (:func:`kernel_prior`), needed by its ``"floored"`` logits only. A head with a pool factor: its scores."""
    return s if pool_power(heads, head) is not None else _base_logits(heads, s, head, prior)


def _base_logits(heads: Heads, s: torch.Tensor, head: str, prior=None) -> torch.Tensor:
    """:func:`logits_of_scores` without a pool factor: the head's own kind of logits of its scores."""
    cal = heads.calibration
    return logit_kinds.head_logits(s, head, cal.kernel_logits, prior, cal.kernel_floor)


def _floored(heads: Heads, head: str) -> bool:
    """Whether ``head`` is the kernel head with ``"floored"`` logits (which need its zero-shot term)."""
    return head == "kernel" and heads.calibration.kernel_logits == "floored"


def needs_prior(heads: Heads, head: str) -> bool:
    """Whether ``head``'s logits need the kernel head's zero-shot term besides its scores (the floored kind)."""
    return _floored(heads, head) and pool_power(heads, head) is None


def _scores_and_prior(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str) -> tuple:
    """(the scores without a pool factor, the zero-shot term where the floored kernel logits need it, else None): the
    term is computed once, for both."""
    if not _floored(heads, head):
        return _base_scores(heads, prototypes, kind, x, head), None
    k = heads.kernel
    prior = kernel_prior(heads, prototypes, x)
    with torch.no_grad():
        return kernel_scores(x, k.rows, k.bandwidth, k.votes, kind) + prior, prior


def logits(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str,
           twins: Optional[torch.Tensor] = None) -> torch.Tensor:
    if pool_power(heads, head) is not None:
        return tie(_factored_logits(heads, prototypes, kind, x, head), twins)
    s, prior = _scores_and_prior(heads, prototypes, kind, x, head)
    return tie(_base_logits(heads, s, head, prior), twins)


def proba(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str,
          twins: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``softmax(logits / T_head)`` (float64); the mixture's :func:`mixture_proba`; a head with a pool factor's
    ``softmax(z⁰ + a·(x̂ W_Gᵀ + b_G))``. ``twins``: tied exactly (:func:`tie`), each row divided by its new sum."""
    if pool_power(heads, head) is not None:
        p = torch.softmax(_factored_logits(heads, prototypes, kind, x, head), dim=1)
    else:
        p = _base_proba(heads, prototypes, kind, x, head)
    if twins is None:
        return p
    p = tie(p, twins)
    return p / p.sum(dim=1, keepdim=True)


def _base_proba(heads: Heads, prototypes, kind: str, x: torch.Tensor, head: str) -> torch.Tensor:
    """:func:`proba` without a pool factor: the head as the shots left it."""
    if head == MIXTURE:
        return mixture_proba(heads, prototypes, kind, x)
    s, prior = _scores_and_prior(heads, prototypes, kind, x, head)
    return calibration.softmax(_base_logits(heads, s, head, prior), heads.calibration.temperatures[head])


def proba_of_scores(heads: Heads, s: torch.Tensor, head: str, prior=None) -> torch.Tensor:
    """:func:`proba` from scores already computed (``prior``: see :func:`logits_of_scores`)."""
    return calibration.softmax(logits_of_scores(heads, s, head, prior), temperature(heads, head))


TEXT_RULE_KERNEL_LOGITS = ("the text rule: its temperature matches log scores on the text queries, and without "
                           "labels nothing measures whether raw votes fit better")


def text_calibration(heads: Heads, prototypes, per_template, kind: str, only: Optional[str] = None,
                     config=None) -> Calibration:
    """Per-head temperatures from the text side (:func:`svgen.heads.calibration.text_temperatures`). ``only``: re-set
    that head's alone where the others were fitted on shots (``loo-nll``) and are unchanged. The text rule
    matches log scores, so a kernel head it sets has ``kernel_logits = "log"``. ``config``: the queries' sizes
    (:class:`svgen.adapt.config.AdaptConfig`)."""
    prev = heads.calibration
    restrict = only is not None and prev is not None and prev.method is CalibrationMethod.HELD_OUT_NLL
    info = calibration.text_temperatures(lambda q, h: scores(heads, prototypes, kind, q, h), per_template,
                                         **({"heads": (only,)} if restrict else {}), config=config)
    temps = info.pop("temperatures")
    kernel = {"kernel_logits_choice": {"reason": TEXT_RULE_KERNEL_LOGITS}}
    if restrict:   # only that head's queries are scored: the others' temperatures are kept
        return Calibration({**prev.temperatures, only: temps[only]}, "log" if only == "kernel" else prev.kernel_logits,
                           {**prev.record, "text_rule_heads": [only], **(kernel if only == "kernel" else {})},
                           None if only == "kernel" else prev.kernel_floor, method=prev.method)
    return Calibration(temps, "log", {**info, **kernel})


def with_temperatures(cal: Calibration, temperatures: dict, method, kernel_logits: Optional[str] = None,
                      kernel_floor: Optional[float] = None, **details) -> Calibration:
    """``cal`` with some heads' temperatures replaced (checked), ``method`` (a :class:`~svgen.state.CalibrationMethod`,
    or a caller's own name for one: :attr:`~svgen.state.CalibrationMethod.GIVEN`) and ``details`` recorded; a new
    ``kernel_logits`` kind comes with its ``kernel_floor`` (ε) when it is ``"floored"``. The mixture's weight and its
    offset for classes without shots are kept (its parts are calibrated by whatever T they have)."""
    if kernel_logits is not None:
        logit_kinds.check_kernel_logits(kernel_logits)
        if (kernel_logits == "floored") != (kernel_floor is not None):
            raise SvgenError("the 'floored' kernel logits need kernel_floor (ε in (0, 1)), and only they take one")
        if kernel_floor is not None:
            logit_kinds.check_floor(kernel_floor)
        if kernel_logits != cal.kernel_logits and "kernel" not in temperatures:
            raise SvgenError(f"changing the kernel head's logits to {kernel_logits!r} needs its temperature "
                             "for them too (temperatures={'kernel': T})")
    for head, t in temperatures.items():
        if head not in HEADS:
            raise SvgenError(f"unknown head {head!r}; expected one of {', '.join(HEADS)}")
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise SvgenError(f"temperature of the {head} head must be a positive number, got {t!r}")
    return Calibration({**cal.temperatures, **{h: float(t) for h, t in temperatures.items()}},
                       cal.kernel_logits if kernel_logits is None else kernel_logits,
                       {**cal.record, "method": getattr(method, "value", method), **details},
                       cal.kernel_floor if kernel_logits is None else kernel_floor, cal.mixture_weight,
                       cal.shotless_offset, CalibrationMethod.named(method))
