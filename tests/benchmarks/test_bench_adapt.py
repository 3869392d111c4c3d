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
    # GDA: the Gaussian log-likelihood ratio x Σ⁻¹μᵀ − ½μΣ⁻¹μᵀ with the Ledoit–Wolf covariance (scikit-learn's) …
    from sklearn.covariance import ledoit_wolf

    W, b = bench.gda_terms(X, y, C, "lw")
    mu = np.stack([X[y == c].mean(0) for c in range(C)])
    cov, _ = ledoit_wolf(X - mu[y], assume_centered=True)
    inv = np.linalg.inv(cov)
    np.testing.assert_allclose(Q @ W + b, Q @ inv @ mu.T - 0.5 * np.einsum("cd,de,ce->c", mu, inv, mu), rtol=1e-8)
    # … and with the authors' KS estimator, written as their code writes it (torch: Tensor.cov, linalg.pinv)
    import torch

    Z = torch.tensor(X - mu[y])
    S = Z.T.cov()
    ks = (D * torch.linalg.pinv((Z.shape[0] - 1) * S + S.trace() * torch.eye(D, dtype=torch.float64))).numpy()
    W, b = bench.gda_terms(X, y, C)
    np.testing.assert_allclose(Q @ W + b, Q @ ks @ mu.T - 0.5 * np.einsum("cd,de,ce->c", mu, ks, mu), rtol=1e-7)
    W1, b1 = bench.gda_terms(X[:C], y[:C], C)     # one shot per class: Σ = I
    np.testing.assert_allclose(W1, X[:C].T, rtol=1e-12)
    # ProKeR-style: the ridge solution interpolates the residual as λ → 0
    B = bench.proker_terms(X, y, P, C, 5.5, 1e-10)
    R = Y - bench.softmax(100 * X @ P.T)
    np.testing.assert_allclose(np.exp(-5.5 * (1 - X @ X.T)) @ B, R, atol=1e-5)


def test_run_reports_every_method_and_the_intervals(bench, tmp_path, monkeypatch):
    _toy(tmp_path)
    monkeypatch.setitem(bench.load_dataset.__globals__, "FEWSHOT", tmp_path)   # bench_common's loader
    out = bench.run_dataset("toy", [1, 2, 12], seeds=2, log=lambda *a: None)
    assert set(out) == {1, 2}                      # 12 shots: a class has ≤ 12 images, skipped
    r = out[2]
    n_queries = 2 * (40 - 8)
    methods = {"zero_shot", "svgen", "svgen_kernel", "svgen_linear", *bench.PEERS, *bench.ORACLES}
    assert set(r["correct"]) == methods and all(v.shape == (n_queries,) for v in r["correct"].values())
    assert set(r["nll"]) == {"svgen", "zero_shot"}
    rows = bench.summarise({"toy": out}, [1, 2])
    mean = [x for x in rows if x["dataset"] == "mean" and x["shots"] == 2][0]
    assert mean["best_realistic_peer"] in bench.PEERS and mean["best_oracle_peer"] in bench.ORACLES
    d = [x for x in rows if x["dataset"] == "toy" and x["shots"] == 2][0]["svgen_minus_zero_shot"]
    assert d["ci95"][0] <= d["diff"] <= d["ci95"][1]
    # the oracle lines are tuned on the queries: never below their cross-validated versions
    for peer, cv in (("tip", "tip_cv"), ("gda", "gda_cv"), ("gda_lw", "gda_lw_cv"), ("proker", "proker_cv"),
                     ("lpp", "lpp")):
        assert r["correct"][f"{peer}_oracle"].mean() >= r["correct"][cv].mean() - 1e-12
    assert "| **mean of 1** | 2 |" in bench.markdown({"rows": rows})
    # each head's held-out estimate and query accuracy; the default head's query accuracy is svgen's
    row = [x for x in rows if x["dataset"] == "toy" and x["shots"] == 2][0]
    assert set(row["estimate"]) == set(row["query"]) == set(bench.HEADS)
    assert row["query"]["default"] == pytest.approx(row["svgen"])
    assert row["query"]["kernel"] == pytest.approx(row["svgen_kernel"])
    assert "| toy | 2 | default |" in bench.compare({"rows": rows}, {"rows": rows})


def test_gda_leave_one_out_and_proker_published(bench):
    """GDA's exact leave-one-shot-out logits equal refitting without each shot (every class kept, scored against all
    classes); ProKeR's published form term by term."""
    rng = np.random.default_rng(4)
    C, D, k = 5, 10, 3
    y = np.repeat(np.arange(C), k)
    X = bench.unit(rng.normal(size=(C, D))[y] + 0.5 * rng.normal(size=(len(y), D)))
    L = bench.gda_loo_logits(X, y, C)
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        W, b = bench.gda_terms(X[keep], y[keep], C, "ks")
        np.testing.assert_allclose(L[i], X[i] @ W + b, rtol=1e-8, atol=1e-8)
    P = bench.unit(rng.normal(size=(C, D)))
    Q = bench.unit(rng.normal(size=(4, D)))
    beta, lam = bench.PROKER_PUBLISHED[4]
    A = np.linalg.inv(np.exp(-beta * (1 - X @ X.T)) / lam + np.eye(len(y))) @ (np.eye(C)[y] - X @ P.T)
    np.testing.assert_allclose(bench.proker_published(Q, X, y, P, C, 4), Q @ P.T + np.exp(-beta * (1 - Q @ X.T)) @ A,
                               rtol=1e-8)
    f, info = bench.gda_loo_scorer(X, y, P, C)
    Z = 100 * X @ P.T
    accs = [((Z + a * L).argmax(1) == y).mean() for a in bench.GDA_ALPHAS]
    assert info["alpha"] == bench.GDA_ALPHAS[int(np.argmax(accs))]


def test_lpp_matches_its_reference_loop_with_autograd(bench):
    """LP++ against a second implementation: the authors' loop written with torch autograd and torch's SGD (momentum
    0.9; α's gradient never zeroed, a step every 10th epoch), from the same starting point and step sizes."""
    import torch

    rng = np.random.default_rng(3)
    C, D, k = 4, 12, 3
    X = bench.unit(rng.normal(size=(C * k, D)) + np.repeat(rng.normal(size=(C, D)), k, axis=0))
    y = np.repeat(np.arange(C), k)
    P = bench.unit(rng.normal(size=(C, D)))
    epochs = 40
    f, snaps = bench.lpp_fit(X, y, P, C, epochs=epochs, snapshot_every=10, dtype=np.float64)

    Xt, Pt, yt = torch.tensor(X), torch.tensor(P), torch.tensor(y)
    S = Xt @ Pt.T
    W = torch.nn.Parameter(torch.zeros(C, D, dtype=torch.float64).index_add_(0, yt, Xt))
    b = torch.nn.Parameter(torch.zeros(C, dtype=torch.float64))
    own = torch.stack([S[yt == c, c].mean() for c in range(C)])
    alpha = (250.0 * own.mean() * torch.ones(C, dtype=torch.float64)).requires_grad_(True)
    lr_w = 4 * len(y) / float(torch.linalg.eigvalsh(Xt.T @ Xt).max())
    lr_alpha = len(y) / (4 * float((S ** 2).sum(0).max()))
    opt = torch.optim.SGD([W, b], lr=lr_w, momentum=0.9)
    for epoch in range(epochs):
        loss = torch.nn.functional.cross_entropy(Xt @ W.T + b + alpha * S, yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (epoch + 1) % 10 == 0:
            alpha.data -= lr_alpha * alpha.grad.data
    Q = bench.unit(rng.normal(size=(5, D)))
    ref = (torch.tensor(Q) @ W.T + b + alpha * (torch.tensor(Q) @ Pt.T)).detach().numpy()
    np.testing.assert_allclose(f(Q), ref, rtol=1e-9, atol=1e-9)
    assert len(snaps) == epochs // 10
    np.testing.assert_allclose(snaps[-1](Q), ref, rtol=1e-9, atol=1e-9)
    # the fit learns the shots: training accuracy 1 on separable toy classes
    assert (f(X).argmax(1) == y).all()


def test_merge_takes_svgen_from_the_rerun_and_refuses_other_shots(bench):
    row = lambda d, k, sv, tip: {"dataset": d, "shots": k, "zero_shot": 50.0, "svgen": sv, "svgen_kernel": sv - 1,  # noqa: E731
                                 "svgen_linear": sv - 2, "tip": tip, "estimate": {"default": sv},
                                 "svgen_minus_zero_shot": {"diff": sv - 50.0}}
    mean = {"dataset": "mean", "shots": 2, "n_datasets": 2, "zero_shot": 50.0, "svgen": 61.0, "svgen_kernel": 60.0,
            "svgen_linear": 59.0, "tip": 55.0}
    base = {"machine": "a", "rows": [row("x", 2, 60.0, 55.0), row("y", 2, 62.0, 55.0), mean]}
    out = bench.merge(base, {"machine": "b", "rows": [row("y", 2, 66.0, 55.0)]})
    x, y, m = out["rows"]
    assert x == base["rows"][0] and y["svgen"] == 66.0 and y["estimate"] == {"default": 66.0}
    assert y["svgen_minus_zero_shot"]["diff"] == 16.0 and y["tip"] == 55.0
    assert (m["svgen"], m["svgen_kernel"], m["svgen_linear"], m["tip"]) == (63.0, 62.0, 61.0, 55.0)
    assert base["rows"][2]["svgen"] == 61.0 and out["merged"]["updated"] == ["y 2"]   # the base is left as it was
    with pytest.raises(ValueError, match="tip differs"):
        bench.merge(base, {"rows": [row("y", 2, 66.0, 54.0)]})


def test_dev_page_states_each_check_from_the_rows(bench):
    """The dev page of issue 47 item 7: per cell, default ≥ max(kernel, linear) − 0.1 and ≥ before − 0.3; per shot
    count, the default's mean ≥ every peer's mean (each verdict recomputed here from the rows)."""
    def row(d, sv, kern, lin, peers, top5=80.0, nll=1.5):
        return {"dataset": d, "shots": 2, "zero_shot": 40.0, "svgen": sv, "svgen_kernel": kern, "svgen_linear": lin,
                **dict(zip(("gda_cv", "proker", "proker_cv"), peers)), "svgen_top5": top5, "svgen_nll": nll,
                "svgen_minus_zero_shot": {"diff": sv - 40.0, "ci95": [sv - 41.0, sv - 39.0]}}
    before = {"seeds": 3, "rows": [row("a", 60.0, 60, 59, (50, 55, 58)), row("b", 50.0, 50, 49, (45, 48, 53))]}
    after = {"seeds": 3, "rows": [row("a", 60.05, 60.1, 59, (50, 55, 58)), row("b", 49.6, 49.75, 49, (45, 48, 53)),
                                  {"dataset": "mean", "shots": 2}]}
    page = bench.dev_page(before, after)
    assert "Dev-only" in page and "do not edit by hand" in page
    line = {r.split(" | ")[0][2:]: r for r in page.splitlines() if r.startswith(("| a |", "| b |"))}
    # a: 60.05 ≥ 60.1 − 0.1 and ≥ 60 − 0.3; b: 49.6 < 49.75 − 0.1 and < 50 − 0.3
    assert line["a"].endswith("| yes | yes |") and line["b"].endswith("| **no** | **no** |")
    assert "+20.05 [+19.05, +21.05]" in line["a"]
    # means at 2 shots: default (60.05 + 49.6)/2 = 54.825 < ProKeR-CV's (58 + 53)/2 = 55.5
    mean = next(r for r in page.splitlines() if r.startswith("| 2 | a, b |"))
    assert "| 54.83 | 55.00 |" in mean and "55.50" in mean and mean.endswith("| **no** |")


def test_means_page_checks_the_means_and_gives_the_paired_intervals(bench, monkeypatch):
    """The means page: per shot count, the default's mean against each peer's, with the paired bootstrap of their
    difference taken from the run (the verdict recomputed here from the means)."""
    def mean(k, sv, peers):
        return {"dataset": "mean", "shots": k, "svgen": sv, "svgen_kernel": sv - 1, "svgen_linear": sv - 2,
                "zero_shot": 40.0, **dict(zip(("gda_cv", "proker", "proker_cv"), peers)),
                **{f"svgen_minus_{m}": {"diff": sv - v, "ci95": [sv - v - 0.5, sv - v + 0.5]}
                   for m, v in zip(("gda_cv", "proker", "proker_cv"), peers)}}
    run = {"datasets": ["a", "b"], "shots": [1, 2], "seeds": 3, "peers": ["gda_cv", "proker", "proker_cv"],
           "rows": [{"dataset": "a", "shots": 1}, {"dataset": "b", "shots": 1}, mean(1, 60.0, (50, 55, 58)),
                    {"dataset": "a", "shots": 2}, mean(2, 57.0, (50, 55, 58))]}
    monkeypatch.setattr(bench, "markdown", lambda result: f"every set of {result['datasets']}\n")
    page = bench.means_page(run)
    assert page.endswith("## Every set and peer: --shots 1 2\n\nevery set of ['a', 'b']\n")
    assert "Dev-only" in page and "do not edit by hand" in page and "--shots 1 2 --seeds 3" in page
    one = next(r for r in page.splitlines() if r.startswith("| 1 | a, b |"))
    two = next(r for r in page.splitlines() if r.startswith("| 2 | a |"))
    assert "+2.00 [+1.50, +2.50]" in one and one.endswith("| yes |")
    assert "-1.00 [-1.50, -0.50]" in two and two.endswith("| **no** |")


def test_summarise_gives_the_paired_interval_of_the_default_against_each_peer(bench):
    """The mean row's interval is the bootstrap of the mean over the sets of the per-image differences."""
    rng = np.random.default_rng(0)
    runs = {}
    for name, n in (("a", 50), ("b", 80)):
        correct = {m: (rng.random(n) < p).astype(float) for m, p in (("zero_shot", .4), ("svgen", .7), ("svgen_kernel", .6),
                                                       ("svgen_linear", .6), ("tip", .5), ("proker_cv", .65), ("tip_oracle", .6))}
        runs[name] = {2: {"correct": correct, "top5": correct, "nll": {"svgen": np.ones(n), "zero_shot": np.ones(n)},
                          "info": [{"kernel": {"adopted": True}, "default_head": "mixture", "mixture_weight": .5,
                                    "held_out_estimate": dict.fromkeys(("kernel", "linear", "default"), .6),
                                    "query_accuracy": dict.fromkeys(("kernel", "linear", "default"), .6),
                                    "adapt_s": 1.0}]}}
    rows = bench.summarise(runs, [2])
    m = rows[-1]
    want = np.mean([100 * (runs[n][2]["correct"]["svgen"].astype(float)
                           - runs[n][2]["correct"]["proker_cv"]).mean() for n in runs])
    assert m["dataset"] == "mean" and abs(m["svgen_minus_proker_cv"]["diff"] - want) < 1e-12
    lo, hi = m["svgen_minus_proker_cv"]["ci95"]
    assert lo < want < hi
