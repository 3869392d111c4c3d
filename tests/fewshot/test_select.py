"""The held-out shots every adaptive choice is scored on (svgen.fewshot.select): the fold scheme, the shot sample and
the one paired acceptance test."""

import numpy as np
import pytest

from svgen.fewshot import select


def test_balanced_folds_subsample_shots_never_classes():
    y = np.repeat(np.arange(300), 4)                          # 1,200 shots: 4 folds of 300 before subsampling
    full = select.balanced_folds(y, seed=3)
    assert [f.size for f in full] == [300] * 4
    folds = select.balanced_folds(y, seed=3, n_max=256)
    held = np.concatenate(folds)
    assert held.size <= 256 and np.unique(held).size == held.size
    assert all(np.unique(y[f]).size == f.size for f in folds)             # at most one shot of a class per fold
    assert all(np.isin(f, g).all() for f, g in zip(folds, full))          # each a part of its full fold
    assert np.unique(y[held]).size == held.size                           # runs of classes: as many as can be
    roomy = select.balanced_folds(y, seed=3, n_max=2000)                 # under the cap: the full folds
    assert len(roomy) == len(full) and all(np.array_equal(a, b) for a, b in zip(roomy, full))


def test_shot_sample_spreads_over_classes_first():
    y = np.repeat(np.arange(10), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert select.shot_sample(y, len(y)) is None
    s = select.shot_sample(y, 10, seed=1)
    assert s.size == 10 and np.unique(y[s]).size == 10                    # one of each class before any second
    s = select.shot_sample(y, 25, seed=1)
    counts = np.bincount(y[s], minlength=10)
    assert s.size == 25 and counts.min() >= 1 and counts.max() - counts[counts < np.bincount(y)].min() <= 1
    assert np.array_equal(select.shot_sample(y, 25, seed=1), s)           # seeded
    assert np.isin(select.shot_sample(y, 12, seed=1), s).all()            # a smaller sample is part of a larger


def test_paired_test_one_level_and_ties_keep():
    rng = np.random.default_rng(0)
    base = rng.random(400) < 0.6
    d = select.paired_test(base.copy(), base)
    assert d.kept and d.reason is select.Reason.NOT_BEHIND and d.evidence.difference == 0.0
    worse = base & (rng.random(400) < 0.7)                                # loses 30% of the baseline's right answers
    d = select.paired_test(worse, base)
    assert not d.kept and d.reason is select.Reason.BEHIND
    assert d.evidence.difference == pytest.approx(worse.mean() - base.mean())
    diff = worse.astype(float) - base
    assert d.evidence.standard_error == pytest.approx(diff.std(ddof=1) / np.sqrt(400))
    rec = d.to_json()
    assert rec["adopted"] is False and rec["shots_compared"] == 400 and rec["rule"] == select.ACCEPTANCE_RULE
    one = base.copy()
    one[np.flatnonzero(base)[0]] = False                                  # behind by one shot: within 1 SE, kept
    assert select.paired_test(one, base).kept
