"""svgen's one root finder (svgen.core.roots) against scipy's brentq on functions with known roots."""

from __future__ import annotations

import math

import pytest

from svgen.core.roots import bisect, convex_minimum, golden_minimum, newton_minimum

optimize = pytest.importorskip("scipy.optimize")

# (f increasing on [lo, hi] with one root inside)
FUNCTIONS = [
    (lambda x: x ** 3 - 2.0, 0.0, 3.0),
    (lambda x: math.exp(x) - 5.0, -2.0, 4.0),
    (lambda x: math.tanh(4.0 * (x - 0.3)), -1.0, 1.0),
    (lambda x: math.log(x) + x - 2.0, 0.1, 5.0),
]


@pytest.mark.parametrize("f, lo, hi", FUNCTIONS)
def test_bisect_finds_the_root_brentq_finds(f, lo, hi):
    root = optimize.brentq(f, lo, hi, xtol=1e-14)
    assert bisect(lambda x: f(x) < 0, lo, hi, 100) == pytest.approx(root, abs=1e-12)
    assert bisect(lambda x: f(x) < 0, lo, hi, 100, tol=1e-6) == pytest.approx(root, abs=1e-6)


@pytest.mark.parametrize("f, lo, hi", FUNCTIONS)
def test_convex_minimum_is_the_root_of_the_slope_or_an_end(f, lo, hi):
    root = optimize.brentq(f, lo, hi, xtol=1e-14)
    assert convex_minimum(f, lo, hi, 100) == pytest.approx(root, abs=1e-12)
    assert convex_minimum(f, root + 0.05, hi, 100) == root + 0.05     # slope ≥ 0 at the lower end: that end
    assert convex_minimum(f, lo, root - 0.05, 100) == root - 0.05     # slope ≤ 0 at the upper end: that end
    assert convex_minimum(lambda x: 0.0, lo, hi, 100) == lo
    assert convex_minimum(lambda x: 0.0, lo, hi, 100, flat="hi") == hi


@pytest.mark.parametrize("f, lo, hi", FUNCTIONS)
def test_newton_minimum_finds_the_root_of_an_increasing_slope(f, lo, hi):
    """The slope f(a + lo) on a ≥ 0 (shifted so the bracket starts at 0), its curvature by central differences."""
    root = optimize.brentq(f, lo, hi, xtol=1e-14)

    def derivatives(a, h=1e-6):
        return f(a + lo), (f(a + lo + h) - f(a + lo - h)) / (2 * h)

    assert newton_minimum(derivatives, step=1.0, tol=1e-12) + lo == pytest.approx(root, abs=1e-8)


def test_newton_minimum_stays_at_zero_and_stops_where_flat():
    assert newton_minimum(lambda a: (a + 1.0, 1.0), step=1.0, tol=1e-9) == 0.0
    # slope −e^{−a} never turns (Newton steps a → a + 1): the first point whose step promises at most `flat` is kept
    a = newton_minimum(lambda a: (-math.exp(-a), math.exp(-a)), step=1.0, tol=1e-12, flat=1e-6)
    assert a == math.ceil(math.log(0.5 / 1e-6))



@pytest.mark.parametrize("f, lo, hi, minimiser", [
    (lambda x: (x - 0.3) ** 2, 0.0, 1.0, 0.3),
    (lambda x: math.exp(x) - 2.0 * x, -1.0, 3.0, math.log(2.0)),
    (lambda x: math.cosh(x - 0.7), -2.0, 2.0, 0.7),
    (lambda x: abs(x - 0.123), 0.0, 1.0, 0.123),      # not smooth: values alone suffice
    (lambda x: x, -1.0, 1.0, -1.0),                   # monotone: the lower end
])
def test_golden_minimum_finds_the_minimiser(f, lo, hi, minimiser):
    x, value = golden_minimum(f, lo, hi, 60)
    assert x == pytest.approx(minimiser, abs=1e-6) and value == f(x)
