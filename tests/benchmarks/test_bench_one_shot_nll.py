"""The one-shot NLL measurement (benchmarks/bench_one_shot_nll.py) on a small synthetic "CoOp" folder: the floor
keeps every row's argmax, the floored logits are the formula, ε and T are the shots' LOO-NLL choice, and the
"svgen" column is the deployed classifier's NLL."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_script, write_textlike_val_toy

from svgen.heads import calibration


@pytest.fixture
def toy(tmp_path, monkeypatch):
    bench = load_script("bench_one_shot_nll")
    adapt = load_script("bench_adapt")
    X, y, P = write_textlike_val_toy(tmp_path, "fgvc", C=6, n_val=8)
    monkeypatch.setattr(adapt, "FEWSHOT", tmp_path)
    return bench, X, y, P


def test_the_floor_keeps_the_argmax_and_is_the_formula():
    bench = load_script("bench_one_shot_nll")
    rng = np.random.default_rng(0)
    s = rng.normal(size=(50, 7)) * 0.3 + 0.1               # scores, many ≤ 0
    p0 = rng.dirichlet(np.full(7, 0.3), size=50)          # confident zero-shot rows
    for eps in bench.FLOORS:
        z = bench.floored_log(s, p0, eps)
        assert (z.argmax(1) == s.argmax(1)).all()
        i, c = 3, int(np.argmin(s[3]))
        want = np.log(max(s[i, c], eps * p0[i, c] * s[i].max() / p0[i].max(), 1e-30))
        assert z[i, c] == pytest.approx(want)
        top = s.argmax(1)
        assert np.allclose(z[np.arange(50), top], np.log(s[np.arange(50), top]))   # the top score is its own log


def test_rows_are_the_loo_choice_and_the_deployed_nll(toy):
    bench, X, y, P = toy
    rows = bench.run_dataset("fgvc", 1)
    r = rows[0]
    assert r["floored"]["eps"] in bench.FLOORS and r["floored"]["argmax_kept"]
    # svgen's column: the deployed classifier's query NLL, independently
    from svgen import SVGClassifier

    s, q = bench.sample(y, 1, 0)
    Xu = X / np.linalg.norm(X, axis=1, keepdims=True)
    clf = SVGClassifier().fit((P / np.linalg.norm(P, axis=1, keepdims=True)).astype(np.float32))
    clf.adapt(Xu[s].astype(np.float32), y[s])
    p = np.asarray(clf.predict_proba(Xu[q].astype(np.float32)), dtype=np.float64)
    assert r["svgen_nll"] == pytest.approx(float(-np.log(np.maximum(p[np.arange(len(q)), y[q]], 1e-300)).mean()),
                                           rel=1e-6)
    # ε: the lowest LOO NLL over the grid, T its minimiser
    from svgen.adapt import residual

    fit = residual.fit_residual_head(Xu[s].astype(np.float32), y[s], (P / np.linalg.norm(P, axis=1, keepdims=True))
                                     .astype(np.float32), 6, seed=0)
    p0s = residual.prior_probs(fit.rows, residual.unit(P.astype(np.float32)))
    loo = {e: bench.floored_log(fit.loo_scores, p0s, e) for e in bench.FLOORS}
    nlls = {e: bench.mean_nll(z, y[s], calibration.fit_temperature(torch.from_numpy(z), y[s])) for e, z in loo.items()}
    assert r["floored"]["eps"] == min(nlls, key=nlls.get)
    assert r["floored"]["loo_nll"] == pytest.approx(nlls[r["floored"]["eps"]])
