"""The peers benchmark (benchmarks/bench_adapt.py) on a small synthetic "CoOp" folder: its protocol and its peers'
formulas (the real run needs ../shared/data)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_script, write_coop_toy


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_adapt")


def _toy(root, name="toy", C=4, D=16, n_val=10):
    data = write_coop_toy(root, name, C=C, D=D, splits=(("val", n_val),), centre_scale=3.0)
    X, y = data["val"]
    P = np.stack([X[y == c].mean(0) for c in range(C)]) + 0.8 * np.random.default_rng(1).normal(size=(C, D))
    np.save(root / name / "textlike_prototypes.npy", (P / np.linalg.norm(P, axis=1, keepdims=True)).astype(np.float32))
    return X, y


def test_shots_and_queries_partition_val_and_every_class_has_k_shots(bench):
    y = np.repeat(np.arange(5), 7)
    s, q = bench.sample(y, 3, seed=2)
    assert np.intersect1d(s, q).size == 0 and np.union1d(s, q).size == len(y)
    assert np.bincount(y[s]).tolist() == [3] * 5
    folds = bench.halves(y[s], 0)
    a, b = folds[0]
    assert np.intersect1d(a, b).size == 0 and set(np.bincount(y[s][a])) == {1}
    assert np.array_equal(folds[1][0], b) and np.array_equal(folds[1][1], a)
    assert bench.halves(np.arange(5), 0) is None      # one shot per class: nothing to split


def test_peer_formulas(bench):
    rng = np.random.default_rng(0)
    C, D = 3, 8
    X = bench.unit(rng.normal(size=(9, D)))
    y = np.arange(9) % C
    P = bench.unit(rng.normal(size=(C, D)))
    Q = bench.unit(rng.normal(size=(4, D)))
    Y = np.eye(C)[y]
    # Tip-Adapter: 100·cos + α·exp(−β(1 − cos))·Y, term by term
    ref = np.array([[100 * Q[i] @ P[c] + 2.0 * sum(np.exp(-5.5 * (1 - Q[i] @ X[j])) * (y[j] == c) for j in range(9))
                     for c in range(C)] for i in range(4)])
    np.testing.assert_allclose(bench.tip_scores(Q, P, X, Y, 5.5, 2.0), ref, rtol=1e-10)
    # GDA: the Gaussian log-likelihood ratio x Σ⁻¹μᵀ − ½μΣ⁻¹μᵀ with the Ledoit–Wolf covariance (scikit-learn's)
    from sklearn.covariance import ledoit_wolf

    W, b = bench.gda_terms(X, y, C)
    mu = np.stack([X[y == c].mean(0) for c in range(C)])
    cov, _ = ledoit_wolf(X - mu[y], assume_centered=True)
    inv = np.linalg.inv(cov)
    np.testing.assert_allclose(Q @ W + b, Q @ inv @ mu.T - 0.5 * np.einsum("cd,de,ce->c", mu, inv, mu), rtol=1e-8)
    # ProKeR-style: the ridge solution interpolates the residual as λ → 0
    B = bench.proker_terms(X, y, P, C, 5.5, 1e-10)
    R = Y - bench.softmax(100 * X @ P.T)
    np.testing.assert_allclose(np.exp(-5.5 * (1 - X @ X.T)) @ B, R, atol=1e-5)


def test_run_reports_every_method_and_the_intervals(bench, tmp_path, monkeypatch):
    _toy(tmp_path)
    monkeypatch.setattr(bench, "FEWSHOT", tmp_path)
    out = bench.run_dataset("toy", [1, 2, 12], seeds=2, log=lambda *a: None)
    assert set(out) == {1, 2}                      # 12 shots: a class has ≤ 12 images, skipped
    r = out[2]
    n_queries = 2 * (40 - 8)
    methods = {"zero_shot", "svgen", *bench.PEERS, *bench.ORACLES}
    assert set(r["correct"]) == methods and all(v.shape == (n_queries,) for v in r["correct"].values())
    assert set(r["nll"]) == {"svgen", "zero_shot"}
    rows = bench.summarise({"toy": out}, [1, 2])
    mean = [x for x in rows if x["dataset"] == "mean" and x["shots"] == 2][0]
    assert mean["best_realistic_peer"] in bench.PEERS and mean["best_oracle_peer"] in bench.ORACLES
    d = [x for x in rows if x["dataset"] == "toy" and x["shots"] == 2][0]["svgen_minus_zero_shot"]
    assert d["ci95"][0] <= d["diff"] <= d["ci95"][1]
    # the oracle lines are tuned on the queries: never below their cross-validated versions
    for peer in ("tip", "gda", "proker"):
        assert r["correct"][f"{peer}_oracle"].mean() >= r["correct"][f"{peer}_cv"].mean() - 1e-12
    assert "| **mean of 1** | 2 |" in bench.markdown({"rows": rows})
