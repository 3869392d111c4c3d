"""Issue 22's promises on real CLIP ViT-B/32 features with text-like prototypes, one draw each.

The benchmark (``benchmarks/bench_adapt.py``, ``benchmarks/bench_pool.py``; docs/fewshot.md, docs/transductive.md)
measures them over 3 seeds with intervals; these tests hold the deployed defaults to them on seed 0 of a few
draws that span the regimes: the strongest prior (caltech101, 90% zero-shot), the weakest (fgvc, 18%), the most
classes (sun397, 397), 1 to 8 shots, and pools kept and refused. Shots and queries are validation images (the
prototypes were built from the train rows); the queries are the rest of the validation set. Everything is seeded,
so a failure is a change in behaviour, not noise.

Tip-Adapter (Zhang et al., 2022) is written out here from its paper, ``100·x̂P̂ᵀ + α·exp(−β(1 − x̂X̂ᵀ))Y`` at its
defaults α = 1, β = 5.5, independently of the benchmark's copy.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TOLERANCE = 0.3   # points of top-1 / top-5: the "≥ zero-shot − 0.3"


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def sets():
    """name → (X, y, P, zero-shot classifier), loaded once per module."""
    from svgen import SVGClassifier

    from conftest import SHARED_DATA

    root = SHARED_DATA / "clip-vit-b32" / "coop-fewshot"
    cache = {}

    def get(name):
        if name not in cache:
            d = root / name
            if not (d / "textlike_prototypes.npy").is_file():
                pytest.skip(f"{d} is absent")
            X = _unit(np.load(d / "val_features.npy"))
            y = np.load(d / "val_labels.npy").astype(np.int64)
            P = _unit(np.load(d / "textlike_prototypes.npy"))
            cache[name] = (X, y, P, SVGClassifier().fit(P.astype(np.float32)))
        return cache[name]

    return get


def _draw(y, k, seed=0):
    """k validation images of every class as shots (seeded), the rest as queries."""
    rng = np.random.default_rng(seed)
    s = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), k, replace=False) for c in np.unique(y)]))
    return s, np.setdiff1d(np.arange(len(y)), s)


def _scores(p, y):
    """(top-1 %, top-5 %, NLL) of probabilities (or any scores for the first two) ``p`` against labels ``y``."""
    top1 = 100.0 * float((p.argmax(1) == y).mean())
    top5 = 100.0 * float((np.argsort(-p, axis=1)[:, :5] == y[:, None]).any(1).mean())
    nll = float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())
    return top1, top5, nll


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _adapted(sets, name, k):
    X, y, P, base = sets(name)
    s, q = _draw(y, k)
    clf = copy.deepcopy(base).adapt(X[s].astype(np.float32), y[s])
    return clf, X, y, P, s, q


@pytest.mark.parametrize("name,k", [("caltech101", 1), ("caltech101", 4), ("fgvc", 1), ("fgvc", 4), ("sun397", 1),
                                    ("stanford_cars", 2), ("oxford_pets", 1), ("oxford_flowers", 8), ("ucf101", 8)])
def test_default_head_is_never_below_zero_shot_nor_tip_adapter(sets, name, k):
    clf, X, y, P, s, q = _adapted(sets, name, k)
    Q = X[q]
    z0 = 100.0 * Q @ P.T
    tip = z0 + np.exp(-5.5 * (1.0 - Q @ X[s].T)) @ np.eye(P.shape[0])[y[s]]
    ours = _scores(np.asarray(clf.predict_proba(Q.astype(np.float32)), dtype=np.float64), y[q])
    zero = _scores(_softmax(z0), y[q])
    assert ours[0] >= zero[0] - TOLERANCE and ours[1] >= zero[1] - TOLERANCE, (ours, zero)
    assert ours[2] <= zero[2], (ours, zero)
    assert ours[0] >= _scores(tip, y[q])[0] - TOLERANCE, (ours, _scores(tip, y[q]))


@pytest.mark.parametrize("name,k,kept", [("oxford_pets", 1, True), ("fgvc", 4, False), ("sun397", 1, True)])
def test_a_pool_is_kept_only_where_it_does_not_lose(sets, name, k, kept):
    """The queries as the unlabelled pool: kept where the held-out shots say it is better (then no worse on the
    queries beyond the tolerance), refused where they do not (then every prediction is exactly the inductive one)."""
    clf, X, y, P, s, q = _adapted(sets, name, k)
    Q = X[q].astype(np.float32)
    before = np.asarray(clf.predict_proba(Q), dtype=np.float64)
    clf.adapt(unlabelled=Q)
    after = np.asarray(clf.predict_proba(Q), dtype=np.float64)
    fallback = clf.transductive_.get("fallback")
    assert (fallback is None) == kept, fallback
    if not kept:
        np.testing.assert_array_equal(after, before)
        return
    a, b = _scores(after, y[q]), _scores(before, y[q])
    assert a[0] >= b[0] - TOLERANCE and a[1] >= b[1] - TOLERANCE and a[2] <= b[2], (a, b)


def test_caltech101_one_shot_whole_pool(sets):
    """A hard draw (seed 0: at one shot per class the held-out shots cannot see the two 159-image classes; its
    earlier losses are in docs/history.md): with the pool's likelihood multiplying the default head's calibrated
    probabilities it holds (10 seeds: +0.81 [+0.15, +1.46])."""
    clf, X, y, P, s, q = _adapted(sets, "caltech101", 1)
    Q = X[q].astype(np.float32)
    before = _scores(np.asarray(clf.predict_proba(Q), dtype=np.float64), y[q])
    clf.adapt(unlabelled=Q)
    after = _scores(np.asarray(clf.predict_proba(Q), dtype=np.float64), y[q])
    assert after[0] >= before[0] - TOLERANCE, (after, before)
