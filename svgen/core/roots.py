"""Root finding, once: every temperature, weight and scale svgen searches for is found by one of these.

* :func:`bisect`: the point where a monotone condition flips on a bracket (a temperature on log T, a scale on
  log t, a confidence bound on p).
* :func:`convex_minimum`: the minimiser of a convex function on ``[lo, hi]`` from its slope (an end where the slope
  does not change sign there, else the slope's root by :func:`bisect`).
* :func:`newton_minimum`: the minimiser of a convex function on ``[0, ∞)`` from its slope and curvature, by Newton
  steps kept inside the bracket of the root found so far (safeguarded Newton).
* :func:`golden_minimum`: a minimiser of a function on ``[lo, hi]`` from its values alone (golden-section search;
  the mixture weight of classes without shots, whose objective is not convex in it).
"""

from __future__ import annotations

import math
from typing import Callable, Tuple


def bisect(above: Callable[[float], bool], lo: float, hi: float, iters: int, tol: float = 0.0) -> float:
    """The point where a monotone condition flips on ``[lo, hi]``: the bracket is halved ``iters`` times (or until
    it is narrower than ``tol``), keeping the upper half where ``above(mid)`` is true; returns its midpoint."""
    for _ in range(iters):
        if hi - lo < tol:
            break
        mid = (lo + hi) / 2
        if above(mid):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def convex_minimum(slope: Callable[[float], float], lo: float, hi: float, iters: int, flat: str = "lo") -> float:
    """The minimiser on ``[lo, hi]`` of a convex function with derivative ``slope``: ``lo`` where the slope there is
    ≥ 0, ``hi`` where it is ≤ 0 there, else the slope's root by :func:`bisect` (``iters`` halvings). A slope that is
    0 at both ends (a flat function) gives the end named by ``flat`` (``"lo"`` or ``"hi"``)."""
    if flat == "hi" and slope(hi) <= 0.0:
        return hi
    if slope(lo) >= 0.0:
        return lo
    if flat != "hi" and slope(hi) <= 0.0:
        return hi
    return bisect(lambda x: slope(x) < 0.0, lo, hi, iters)


def newton_minimum(derivatives: Callable[[float], Tuple[float, float]], step: float, tol: float,
                   flat: float = 0.0, iters: int = 500) -> float:
    """The minimiser ``a ≥ 0`` of a convex function given ``derivatives(a) = (slope, curvature)``.

    0 where the slope at 0 is not negative. Else Newton steps on the slope, each kept inside the bracket of the root
    found so far (bisection where a step would leave it; while no root is bracketed, doubling from ``step``), until a
    step moves less than ``tol`` relative, or the decrease a Newton step promises (``slope²/(2·curvature)``) is at most
    ``flat`` (the function is flat there: its minimiser moves with the last bits of the inputs, the stopping point on
    the path from 0 does not). After ``iters`` steps whose slope stays negative: the largest ``a`` tried."""
    slope, curvature = derivatives(0.0)
    if not slope < 0:
        return 0.0
    a, lo, hi = 0.0, 0.0, math.inf
    for _ in range(iters):
        if curvature > 0 and 0.5 * slope * slope / curvature <= flat and a > 0:
            return a
        newton = a - slope / curvature if curvature > 0 else math.inf
        if lo < newton < hi:
            nxt = newton
        elif math.isfinite(hi):
            nxt = 0.5 * (lo + hi)
        else:
            nxt = max(2.0 * a, step)
        if abs(nxt - a) <= tol * nxt:
            return nxt
        a = nxt
        slope, curvature = derivatives(a)
        lo, hi = (a, hi) if slope < 0 else (lo, a)
    return a


def golden_minimum(f: Callable[[float], float], lo: float, hi: float, steps: int) -> Tuple[float, float]:
    """``(x, f(x))``: golden-section search on ``[lo, hi]``, ``steps`` narrowings of the bracket; the better of its
    last two interior points (a tie: the lower one). A minimiser where ``f`` has one minimum on the bracket."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(steps):
        if fa <= fb:
            hi, b, fb, a = b, a, fa, b - g * (b - lo)
            fa = f(a)
        else:
            lo, a, fa, b = a, b, fb, a + g * (hi - a)
            fb = f(b)
    return (float(a), fa) if fa <= fb else (float(b), fb)
