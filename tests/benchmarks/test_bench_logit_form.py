"""The logit-form measurement (benchmarks/bench_logit_form.py) on a small synthetic "CoOp" folder: its probability
form is svgen's kernel head exactly, its logit form is the formula, and the guard picks by the paired-SE rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import load_script, write_textlike_val_toy

from svgen.adapt import heldout, residual


@pytest.fixture
def toy(tmp_path, monkeypatch):
    bench = load_script("bench_logit_form")
    X, y, P = write_textlike_val_toy(tmp_path, "fgvc", C=5, n_val=12)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    return bench, X, y, P


def test_rows_follow_the_guard_and_the_probability_form_is_svgens_head(toy):
    bench, X, y, P = toy
    rows = bench.run_dataset("fgvc", [3], 2)
    assert [r["seed"] for r in rows] == [0, 1]
    for r in rows:
        assert r["pick_logit"] == (r["guard_diff"] > r["guard_se"])
        assert r["guarded"] == (r["logit"] if r["pick_logit"] else r["prob"])
    # seed 0's probability form, independently: svgen's few-shot kernel head scores the same queries
    from svgen import SVGClassifier

    s, q = bench.sample(y, 3, 0)
    clf = SVGClassifier().fit(P.astype(np.float32)).adapt(X[s], y[s])
    got = 100 * float(np.mean(np.asarray(clf.decision_function(X[q], "kernel")).argmax(1) == y[q]))
    assert rows[0]["prob"] == pytest.approx(got)


def test_the_logit_selection_scores_the_formula_on_the_folds(toy):
    bench, X, y, P = toy
    Xs, Ps = bench.unit(X), bench.unit(P)
    sel = bench.logit_select(Xs, y, Ps, 5)
    folds = heldout.balanced_folds(y, 0)
    hf = folds[0]
    keep = np.setdiff1d(np.arange(len(y)), hf)
    K = residual.rbf(Xs[keep], Xs[keep], sel["sigma"]) + sel["c"] * np.eye(keep.size)
    R = np.eye(5)[y[keep]] - residual.prior_probs(Xs[keep], Ps)
    z = 100 * Xs[hf] @ Ps.T + sel["alpha"] * residual.rbf(Xs[hf], Xs[keep], sel["sigma"]) @ np.linalg.solve(K, R)
    assert np.array_equal(sel["held_correct"][: hf.size], z.argmax(1) == y[hf])
    assert math.isclose(sel["held_acc"], float(sel["held_correct"].mean()))
