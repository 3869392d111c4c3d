"""The default head's top-1 check (``default_head`` in svgen.adapt.select.CHOICES, :func:`svgen.adapt.shots.top1_check`):
the NLL weight's head stays unless another head is ahead of it on held-out top-1 by more than one standard error of
the paired difference and not behind it on top-5 and NLL by as much. Each case is built so that the paired differences
are known in closed form and checked here by direct arithmetic, not through svgen.adapt.select."""

from __future__ import annotations

import math

import numpy as np
import pytest

from svgen.adapt.shots import top1_check

C = 8


def one_hot_probs(pred: np.ndarray, second: np.ndarray, top: float = 0.6) -> np.ndarray:
    """M×C probabilities: ``top`` on ``pred``, 0.9 − top on ``second``, the rest spread over the others."""
    p = np.full((pred.size, C), 0.1 / (C - 2))
    p[np.arange(pred.size), pred] = top
    p[np.arange(pred.size), second] = 0.9 - top
    return p / p.sum(axis=1, keepdims=True)


def se_of(a: np.ndarray, b: np.ndarray) -> tuple:
    d = a.astype(float) - b.astype(float)
    return d.mean(), d.std(ddof=1) / math.sqrt(d.size)


def build(n: int, mixture_right: int, kernel_right: int, seed: int = 0):
    """y, and the mixture and kernel heads right on the first ``*_right`` images (else their second choice is y)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    wrong = (y + 1) % C

    def head(right: int):
        pred = np.where(np.arange(n) < right, y, wrong)
        second = np.where(np.arange(n) < right, wrong, y)
        return one_hot_probs(pred, second)

    return y, head(mixture_right), head(kernel_right)


def test_a_head_clearly_ahead_on_top1_and_not_behind_on_top5_and_nll_replaces_the_mixture():
    y, pm, pk = build(200, 100, 140)
    diff, se = se_of(pm.argmax(1) == y, pk.argmax(1) == y)
    assert diff < -se                                          # the mixture behind the kernel head on top-1
    pl = pm.copy()                                             # the linear head: the mixture's twin, not ahead
    choice, _ = top1_check({"mixture": pm, "kernel": pk, "linear": pl}, pm, y, "mixture", 1.0)
    assert choice.chosen == "kernel"
    assert choice.means["kernel"] == pytest.approx(0.7) and choice.means["mixture"] == 0.5


def test_within_one_standard_error_the_mixture_stays():
    # one more right out of 200: d̄ = −0.005, s² = (0.995² + 199 · 0.005²)/199 = 0.005, SE = √(0.005/200) = 0.005:
    # exactly one SE, a tie, which is not ahead
    y, pm, pk = build(200, 100, 101)
    diff, se = se_of(pm.argmax(1) == y, pk.argmax(1) == y)
    assert diff == pytest.approx(-se)
    choice, _ = top1_check({"mixture": pm, "kernel": pk, "linear": pm}, pm, y, "mixture", 1.0)
    assert choice.chosen == "mixture" and choice.best == "kernel"


def test_a_head_ahead_on_top1_but_behind_on_nll_does_not_replace_the_mixture():
    y, pm, pk = build(200, 100, 140)
    pk = pk ** 8                                               # sharper: the same ranking, a far worse NLL
    pk /= pk.sum(axis=1, keepdims=True)
    nll = lambda p: -np.log(p[np.arange(y.size), y])          # noqa: E731
    diff, se = se_of(-nll(pk), -nll(pm))
    assert diff < -se                                          # the kernel head behind on NLL
    choice, _ = top1_check({"mixture": pm, "kernel": pk, "linear": pm}, pm, y, "mixture", 1.0)
    assert choice.chosen == "mixture" and choice.means["kernel"] > choice.means["mixture"]
    assert "NLL" in choice.why


def test_two_heads_equally_ahead_the_one_agreeing_more_with_zero_shot_wins_and_a_better_top1_beats_it():
    y, pm, pk = build(300, 100, 200)
    # two heads right on the same 200 images; zero-shot predicts what the linear head predicts everywhere
    wrong_l = (y + 2) % C
    pl = one_hot_probs(np.where(np.arange(300) < 200, y, wrong_l), np.where(np.arange(300) < 200, wrong_l, y))
    p0 = pl.copy()
    choice, near = top1_check({"mixture": pm, "kernel": pk, "linear": pl}, p0, y, "mixture", 1.0)
    assert near["linear"] == 1.0 > near["kernel"]
    assert choice.chosen == "linear"                           # a tie on top-1 goes to the head nearer zero-shot
    y2, pm2, pk2 = build(300, 100, 210)                        # the same y; the kernel head right on 10 more
    assert np.array_equal(y2, y)
    choice, _ = top1_check({"mixture": pm2, "kernel": pk2, "linear": pl}, p0, y, "mixture", 1.0)
    assert choice.chosen == "kernel"                           # the better top-1 of the two ahead


def test_when_the_nll_chose_one_head_the_other_is_the_only_challenger():
    y, pl, pk = build(200, 100, 140)
    probs = {"mixture": pl, "kernel": pk, "linear": pl}
    choice, _ = top1_check(probs, pl, y, "linear", 1.0)
    assert choice.chosen == "kernel" and list(choice.means) == ["linear", "kernel"]
    choice, _ = top1_check(probs, pl, y, "kernel", 1.0)
    assert choice.chosen == "kernel" and list(choice.means) == ["kernel", "linear"]
