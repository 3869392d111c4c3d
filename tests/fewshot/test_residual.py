"""The adapted kernel head (svgen.adapt.residual): its math against independent computations, its decision
rule, and the artifact that carries it (format 3) through save/load and every export."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from svgen import SVGClassifier, records
from svgen.adapt import residual
from svgen.adapt import heldout
from svgen.adapt.solvers import ridge
from svgen.io.artifacts import FORMAT_VERSION_PRIOR
from svgen.adapt.config import DEFAULT, AdaptConfig
from svgen.adapt.select import choose


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _problem(seed=0, C=5, D=16, per_class=4, spread=0.35):
    """Classes as clusters, prototypes near (not at) their centres: text that is informative but wrong
    for some images."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(C, D)))
    y = np.repeat(np.arange(C), per_class)
    X = _unit(centres[y] + spread * rng.normal(size=(len(y), D)))
    P = _unit(centres + 0.6 * rng.normal(size=(C, D)))
    return X, y, P


def held_out_scores(X: np.ndarray, y: np.ndarray, P: np.ndarray, C: int, sigma: float, c: float,
                    logit_scale: float, seed: int = 0):
    """(rows, scores): the adapted head at (σ, c) refitted without each balanced fold by a direct solve, scored
    on the fold: the independent route to what :func:`svgen.adapt.residual.fit_residual_head` computes in its
    eigenbasis."""
    rows, out = [], []
    p0 = residual.prior_probs(X, P, logit_scale)
    R = np.eye(C)[y] - p0
    for held in heldout.balanced_folds(y, seed):
        keep = np.setdiff1d(np.arange(len(y)), held)
        V = np.linalg.solve(residual.rbf(X[keep], X[keep], sigma) + c * np.eye(keep.size), R[keep])
        rows.append(held)
        out.append(p0[held] + residual.rbf(X[held], X[keep], sigma) @ V)
    return np.concatenate(rows), np.concatenate(out)


def fit_head(X, y, P, config=DEFAULT, seed=0):
    """The kernel head of ``adapt``, on the fit's held-out evidence: (its fit, the evidence)."""
    ev = heldout.evidence(y, P.shape[0], config, seed)
    return residual.fit_residual_head(X, y, P, P.shape[0], ev, config), ev


def test_selection_scores_are_refits_without_each_fold_and_pick_the_best():
    X, y, P = _problem(seed=10, C=5, per_class=4)
    fit, ev = fit_head(X, y, P)
    sel = fit.record["selection"]
    assert fit.adopted and not sel["one_shot"] and sel["folds"] == len(ev.folds) == 4
    rows, scores = held_out_scores(X, y, P, 5, fit.sigma, fit.ridge_c, 100.0)
    np.testing.assert_array_equal(ev.rows, rows)
    np.testing.assert_allclose(fit.held_scores, scores, atol=1e-8)   # eigenbasis route = direct solves
    acc = sel["held_out_accuracy"]
    assert acc == pytest.approx((scores.argmax(1) == y[rows]).mean())
    for f in DEFAULT.sigma_factors:            # no other setting does better on the same folds
        for c in DEFAULT.ridges:
            _, other = held_out_scores(X, y, P, 5, f * sel["median_distance"], c, 100.0)
            assert (other.argmax(1) == y[rows]).mean() <= acc + 1e-12
    zero_shot = (residual.prior_probs(X[rows], P).argmax(1) == y[rows]).mean()
    assert fit.choice.means["zero-shot"] == pytest.approx(zero_shot)   # zero-shot a candidate on the same shots


def test_loo_scores_equal_refitting_without_each_shot():
    X, y, P = _problem(seed=1)
    C, N = P.shape[0], len(y)
    p0 = residual.prior_probs(X, P)
    R = np.eye(C)[y] - p0
    sigma, c = 0.7, 0.3
    loo = ridge.loo_at(X, R, p0, sigma, c)
    for i in range(N):
        keep = np.arange(N) != i
        V = np.linalg.solve(residual.rbf(X[keep], X[keep], sigma) + c * np.eye(N - 1), R[keep])
        refit = p0[i] + residual.rbf(X[i:i + 1], X[keep], sigma) @ V
        np.testing.assert_allclose(loo[i], refit[0], atol=1e-8)


def test_nystrom_solve_is_the_ridge_of_the_approximated_kernel(monkeypatch):
    X, y, P = _problem(seed=2, C=6, per_class=10)
    C = P.shape[0]
    Vall = ridge.solve(X, ridge.residuals(X, y, P, C, 100.0), y, 0.8, 0.5, 0, dense_max=20, basis_size=24)
    assert Vall.shape == (len(y), C)                                       # every shot a row (votes 0 off the basis)
    basis = np.flatnonzero(np.abs(Vall).sum(axis=1) > 0)
    assert 0 < basis.size <= 24
    rows, V = X[basis], Vall[basis]
    # the same head by another route: least squares in the explicit Nyström features φ = k(x, L) K_LL^{-1/2}
    K_LL = residual.rbf(rows, rows, 0.8)
    w, Q = np.linalg.eigh(K_LL)
    inv_sqrt = Q @ np.diag(1 / np.sqrt(np.maximum(w, 1e-12))) @ Q.T
    Phi = residual.rbf(X, rows, 0.8) @ inv_sqrt
    R = np.eye(C)[y] - residual.prior_probs(X, P)
    Wp = np.linalg.solve(Phi.T @ Phi + 0.5 * np.eye(Phi.shape[1]), Phi.T @ R)
    Xq = _unit(np.random.default_rng(5).normal(size=(7, X.shape[1])))
    np.testing.assert_allclose(residual.rbf(Xq, rows, 0.8) @ V, residual.rbf(Xq, rows, 0.8) @ inv_sqrt @ Wp,
                               atol=1e-5)


@pytest.mark.parametrize("subsample", [False, True])
def test_nystrom_fold_scores_are_refits_without_each_fold_in_the_basis_features(subsample):
    """The normal-equation downdates of the held-out refits (single precision) against a second route: for each fold,
    least squares in the explicit Nyström features φ = k(x, L) K_LL^{-1/2} of every shot outside the fold's removed
    ones in a basis of shots it keeps (float64), scored at the fold's scored shots (all of them, or some classes')."""
    X, y, P = _problem(seed=4, C=8, per_class=6)
    C, sigma = P.shape[0], 0.8
    R = np.eye(C)[y] - residual.prior_probs(X, P)
    folds = heldout.scored_folds(heldout.balanced_folds(y, 0, 3), y, 0, 5 if subsample else None)
    assert any(s.size < r.size for r, s in folds) == subsample
    held = np.concatenate([s for _, s in folds])
    p0_held = residual.prior_probs(X[held], P)
    bases = [keep[heldout.shot_sample(y[keep], 20, 0)] for keep in
             (np.setdiff1d(np.arange(len(y)), removed) for removed, _ in folds)]
    scores = dict(ridge.nystrom_fold_scores(X, y, R, p0_held, folds, [sigma], [0.01, 1.0], bases))
    for j, c in enumerate([0.01, 1.0]):
        start = 0
        for removed, scored in folds:
            keep = np.setdiff1d(np.arange(len(y)), removed)
            basis = keep[heldout.shot_sample(y[keep], 20, 0)]   # 20 shots the fold keeps, spread over the classes
            assert not np.isin(basis, removed).any()
            w, Q = np.linalg.eigh(residual.rbf(X[basis], X[basis], sigma))
            ok = w > 1e-10 * w.max()
            Phi = residual.rbf(X, X[basis], sigma) @ (Q[:, ok] / np.sqrt(w[ok]))
            beta = np.linalg.solve(Phi[keep].T @ Phi[keep] + c * np.eye(Phi.shape[1]), Phi[keep].T @ R[keep])
            want = p0_held[start:start + scored.size] + Phi[scored] @ beta
            np.testing.assert_allclose(scores[0, j][start:start + scored.size], want, atol=1e-5)
            start += scored.size


def test_paired_decision_keeps_zero_shot_when_the_correction_hurts():
    y = np.arange(20) % 4
    p0 = np.eye(4)[y] * 0.6 + 0.1                       # zero-shot right on every shot

    def decide(held, zs, y):   # the kernel choice between zero-shot and one correction, as the head records it
        c = choose({residual.ZERO_SHOT: zs.argmax(1) == y, (0.5, 1.0): held.argmax(1) == y}, None, "kernel", 1.0)
        return records.kernel_decision(c.chosen != residual.ZERO_SHOT, c.versus_zero_shot, 1.0)

    worse = np.eye(4)[(y + 1) % 4]                      # adapted LOO wrong on every shot
    d = decide(worse, p0, y)
    assert not d["adopted"] and d["difference"] == pytest.approx(-1.0)
    tie = decide(p0.copy(), p0, y)
    assert tie["adopted"] and tie["difference"] == 0.0
    # one loss and one win: a tie, kept
    zs = p0.copy()
    zs[1] = np.eye(4)[(y[1] + 1) % 4]                 # zero-shot wrong on shot 1
    mixed = p0.copy()
    mixed[0] = np.eye(4)[(y[0] + 1) % 4]              # the adapted head wrong on shot 0
    d = decide(mixed, zs, y)
    assert d["adopted"] and d["difference"] == 0.0


def test_balanced_folds_hold_out_one_shot_per_class_and_refit_exactly():
    X, y, P = _problem(seed=9, C=4, per_class=3)
    y = y.copy()
    y[-1] = 0                                            # class 0 has 4 shots, class 3 has 2
    assert len(heldout.balanced_folds(y, max_folds=2)) == 2
    folds = heldout.balanced_folds(y)
    assert len(folds) == 4 and sorted(np.concatenate(folds).tolist()) == list(range(len(y)))
    for held in folds:
        assert len(np.unique(y[held])) == len(held)     # at most one shot of a class per fold
    rows, scores = held_out_scores(X, y, P, 4, 0.7, 0.4, 100.0)
    held = folds[0]
    keep = np.setdiff1d(np.arange(len(y)), held)
    V = ridge.solve(X[keep], ridge.residuals(X[keep], y[keep], P, 4, 100.0), y[keep], 0.7, 0.4, 0, 4096, 1536)
    expect = residual.prior_probs(X[held], P) + residual.rbf(X[held], X[keep], 0.7) @ V
    np.testing.assert_allclose(scores[:len(held)], expect, atol=1e-9)
    assert rows[:len(held)].tolist() == held.tolist()


def test_one_shot_per_class_uses_the_stated_default_and_has_no_loo():
    X, y, P = _problem(seed=3, per_class=1)
    fit, ev = fit_head(X, y, P)
    assert ev.one_shot and fit.adopted and fit.held_scores.shape == (len(y), P.shape[0])
    want = ridge.loo_at(X, np.eye(P.shape[0])[y] - residual.prior_probs(X, P), residual.prior_probs(X, P),
                        fit.sigma, fit.ridge_c)
    np.testing.assert_allclose(fit.held_scores, want, atol=1e-10)   # the leave-one-out scores
    assert "zero-shot" not in fit.choice.means   # leaving a class's only shot out cannot judge zero-shot
    assert fit.sigma == pytest.approx(1 / math.sqrt(DEFAULT.one_shot_beta))
    assert fit.record["ridge_c"] == DEFAULT.one_shot_ridge
    assert "cannot judge" in fit.record["decision"]["rule"]


# ----------------------------------------------------------------------------- the classifier and its artifact

@pytest.fixture(scope="module")
def adapted():
    X, y, P = _problem(seed=6, C=5, D=16, per_class=6)
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    zs = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    clf.adapt(X.astype(np.float32), y)
    return clf, zs, X, y, P


def test_adapted_scores_are_the_prior_plus_the_kernel_vote(adapted):
    clf, _, X, y, P = adapted
    assert clf.fewshot_["kernel"]["decision"]["adopted"] and clf.kernel_prior_ == 100.0
    Xq = _unit(np.random.default_rng(7).normal(size=(9, X.shape[1]))).astype(np.float32)
    S = clf.support_vectors_.numpy().astype(np.float64)
    expect = residual.prior_probs(_unit(Xq), P) + residual.rbf(_unit(Xq), S, clf.bandwidth_) @ \
        clf.vote_weights_.numpy()
    np.testing.assert_allclose(clf.decision_function(Xq, "kernel"), expect, atol=1e-5)
    assert clf.kernel_logits_ in ("score", "log")
    np.testing.assert_allclose(clf.predict_proba(Xq, "kernel").sum(1), 1.0, atol=1e-9)


def test_format_3_round_trip(adapted, tmp_path):
    clf, _, X, _, _ = adapted
    clf.save(tmp_path / "a.svgen")
    meta = json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())
    assert meta["format_version"] == FORMAT_VERSION_PRIOR and meta["kernel_prior"]["logit_scale"] == 100.0
    again = SVGClassifier.load(tmp_path / "a.svgen")
    Xf = X.astype(np.float32)
    np.testing.assert_allclose(again.decision_function(Xf), clf.decision_function(Xf), atol=1e-6)
    np.testing.assert_allclose(again.predict_proba(Xf), clf.predict_proba(Xf), atol=1e-6)


def test_a_prior_term_outside_format_3_is_refused(adapted, tmp_path):
    from safetensors.torch import load_file, save_file

    from svgen.errors import SvgenError

    clf, zs, _, _, _ = adapted
    zs.save(tmp_path / "z.svgen")
    t = load_file(str(tmp_path / "z.svgen" / "weights.safetensors"))
    t["kernel_prior.logit_scale"] = torch.tensor(100.0)
    save_file(t, str(tmp_path / "z.svgen" / "weights.safetensors"))
    with pytest.raises(SvgenError, match="only valid in format version 3"):
        SVGClassifier.load(tmp_path / "z.svgen")


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_kernel_head_file_carries_the_prior(adapted, tmp_path, fmt):
    from svgen.io.export import export_head, load_head

    clf, _, X, _, P = adapted
    path = tmp_path / f"k.{fmt}"
    export_head(clf, path, fmt, head="kernel")
    h = load_head(path)
    assert float(h["prior_logit_scale"]) == 100.0 and "softmax(prior_logit_scale" in h["usage"]
    # the file's formula, computed from its arrays alone, is the artifact's kernel head
    x = _unit(X)
    scores = residual.prior_probs(x, h["prior_prototypes"], float(h["prior_logit_scale"])) + \
        residual.rbf(x, h["support_vectors"].astype(np.float64), float(h["bandwidth"])) @ h["vote_weights"]
    np.testing.assert_allclose(scores, clf.decision_function(X.astype(np.float32), "kernel"), atol=1e-5)


def test_onnx_kernel_head_matches_with_the_prior(adapted, tmp_path):
    pytest.importorskip("onnxruntime")
    from svgen.io.export import onnx_model, verify_onnx

    clf, _, X, _, _ = adapted
    model = onnx_model(clf, "kernel")
    assert verify_onnx(model, clf, "kernel", X.astype(np.float32)) < 1e-4


def test_refused_correction_leaves_the_zero_shot_kernel_head(monkeypatch):
    X, y, P = _problem(seed=8, per_class=5)
    zs = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    real = residual.choose

    def refuse(candidates, *a):   # the choice keeps zero-shot (its first candidate)
        return dataclasses.replace(real(candidates, *a), chosen=next(iter(candidates)), index=0)

    monkeypatch.setattr(residual, "choose", refuse)
    clf.adapt(X.astype(np.float32), y)
    assert clf.kernel_prior_ is None and not clf.fewshot_["kernel"]["decision"]["adopted"]
    Xq = X.astype(np.float32)
    np.testing.assert_allclose(clf.decision_function(Xq, "kernel"), zs.decision_function(Xq, "kernel"), atol=1e-6)


def test_default_head_is_what_the_held_out_shots_prefer_and_every_entry_point_uses_it(adapted, monkeypatch):
    clf, _, X, _, _ = adapted
    hc = clf.fewshot_["head_choice"]
    w = hc["mixture_weight"]    # by held-out NLL (tests/fewshot/test_mixture.py): 1 the kernel head, 0 the linear
    assert clf.default_head_ == ("kernel" if w == 1 else "linear" if w == 0 else "mixture")
    assert hc["held_out_nll"]["mixture"] <= min(hc["held_out_nll"]["kernel"], hc["held_out_nll"]["linear"]) + 1e-12
    assert clf.fewshot_["default_head"] == clf.default_head_
    Xf = X.astype(np.float32)
    for head in ("kernel", "linear"):   # with no head named, predict/decision_function/predict_proba follow it
        c = copy.deepcopy(clf)
        c.shots_outcome_ = dataclasses.replace(c.shots_outcome_, default_head=head)   # the typed decision
        np.testing.assert_array_equal(c.decision_function(Xf), c.decision_function(Xf, head))
        np.testing.assert_array_equal(c.predict_proba(Xf), c.predict_proba(Xf, head))
        assert (c.predict(Xf) == c.predict(Xf, head)).all()


def test_above_select_max_every_held_out_shot_is_scored_against_all_classes(monkeypatch):
    """Regression (issue 38): above select_max shots the choices were made on the shots of a random subset of whole
    classes, the heads refitted on those classes' shots alone, so the other classes carried no correction (an easier
    problem than the deployed one: on ImageNet it deployed a linear head below zero-shot). Now the held-out shots are
    subsampled, never the classes: every fold's kernel head is the deployed predictor refitted on every other shot of
    every class (checked against a direct Nyström solve), each held-out shot scored against all C classes, and the
    linear head's folds are refitted on every other shot of every class too. And every fold's refit leaves out one
    shot of every class, the scored shots a part of those: a held-out shot's class is not the only one short (when
    only the scored shots were left out, the other classes kept more shots than the held-out one's, which on 1,033
    classes × 2 shots chose σ and c 1.5 points worse on the queries, bench_adapt --datasets all7)."""
    from svgen.adapt.solvers import lda as fewshot

    C = 8
    X, y, P = _problem(seed=3, C=C, per_class=4)
    cfg = AdaptConfig(select_max=16, select_basis=12)
    seen, orig = {}, ridge.nystrom_fold_scores

    def spy(*a, **k):   # the first call scores the whole grid (a second, the chosen cell's scores again)
        out = dict(orig(*a, **k))
        seen.setdefault("folds", a[4])
        seen.setdefault("out", out)
        return out.items()

    monkeypatch.setattr(ridge, "nystrom_fold_scores", spy)
    refits, lda_orig = [], fewshot.lda_head_weights

    def lda_spy(Xk, yk, *a, **k):
        refits.append((len(yk), np.unique(yk.numpy()).size))
        return lda_orig(Xk, yk, *a, **k)

    monkeypatch.setattr(fewshot, "lda_head_weights", lda_spy)
    clf = SVGClassifier(n_support=2, adapt_config=cfg).fit(P.astype(np.float32)).adapt(X.astype(np.float32), y)
    folds = seen["folds"]
    held = np.concatenate([s for _, s in folds])
    assert held.size <= 16 and set(y[held]) == set(range(C))          # scored shots subsampled, every class scored
    assert all(np.isin(s, r).all() for r, s in folds)                  # the scored ones are the fold's removed ones
    assert all(np.unique(y[r]).size == r.size == C for r, _ in folds)  # a refit: every class one shot short
    scores = seen["out"]
    assert all(sc.shape == (held.size, C) for sc in scores.values())   # each scored against all C classes
    rec = clf.fewshot_["kernel"]
    sigma, c = rec["sigma"], rec["ridge_c"]
    i, j = DEFAULT.sigma_factors.index(rec["selection"]["sigma_factor"]), DEFAULT.ridges.index(c)
    # the fold's head, solved directly on every other shot (all classes) in the same basis, gives the same scores
    Xu, Pu = _unit(X), _unit(P)
    p0 = residual.prior_probs(Xu, Pu, 100.0)
    R = np.eye(C)[y] - p0
    want = []
    for removed, scored in folds:
        keep = np.setdiff1d(np.arange(len(y)), removed)
        assert np.unique(y[keep]).size == C                           # every class keeps shots, so its correction
        L = Xu[keep[heldout.shot_sample(y[keep], 12, 0)]]            # the basis: 12 of the shots the fold keeps
        K_LX = residual.rbf(L, Xu[keep], sigma)
        V = np.linalg.solve(K_LX @ K_LX.T + c * residual.rbf(L, L, sigma), K_LX @ R[keep])
        want.append(p0[scored] + residual.rbf(Xu[scored], L, sigma) @ V)
    np.testing.assert_allclose(scores[i, j], np.concatenate(want), atol=1e-5)
    hc = clf.fewshot_["head_choice"]
    assert hc["classes_compared"] == "all" and hc["shots_compared"] == held.size
    fold_refits = [r for r in refits if r[0] in {len(y) - rm.size for rm, _ in folds}]
    assert len(fold_refits) == len(folds) and all(k == C for _, k in fold_refits)   # LDA folds: all classes


def test_cli_classify_and_export_use_the_recorded_default_head(adapted, tmp_path):
    from svgen.cli import main

    clf, _, X, _, _ = adapted
    clf.shots_outcome_ = dataclasses.replace(clf.shots_outcome_, default_head="linear")   # saved as the record
    art = clf.save(tmp_path / "lin.svgen")
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    assert main(["classify", str(art), "--features", str(tmp_path / "x.npy"), "--out", str(tmp_path / "p.csv"),
                 "--top-k", "1"]) == 0
    first = (tmp_path / "p.csv").read_text().splitlines()[1]
    want = clf.predict(X.astype(np.float32), "linear")[0]
    assert want in first
    assert main(["export", str(art), "--format", "npz", "--out", str(tmp_path / "h.npz")]) == 0
    from svgen.io.export import load_head

    assert load_head(tmp_path / "h.npz")["head"] == "linear"


@pytest.mark.parametrize("select_max", [1024, 8])
def test_one_shot_with_more_classes_than_the_lda_loo_subset(monkeypatch, select_max):
    """One shot per class with more shots than the LDA head's leave-one-out subset (ImageNet: 1,000 classes × 1 shot,
    lda_loo_max = 512): one shot per class, every choice (the kernel head's, the linear head's temperature, the
    mixture) is judged on one leave-one-out sample of at most select_max shots (lda_loo_max bounds the leave-one-out
    beside the folds only). The mixture's weight is fitted on those shots, and equals a fit on those rows alone."""
    from svgen.adapt import temperatures

    X, y, P = _problem(seed=5, C=12, per_class=1)
    cfg = AdaptConfig(lda_loo_max=5, select_max=select_max)
    seen, real_evidence, real_weight = {}, heldout.evidence, temperatures.fit_weight

    def evidence(*a):
        seen["ev"] = real_evidence(*a)
        return seen["ev"]

    def fit_weight(*a):
        seen["fit"] = a
        return real_weight(*a)

    monkeypatch.setattr(heldout, "evidence", evidence)
    monkeypatch.setattr(temperatures, "fit_weight", fit_weight)
    clf = SVGClassifier(n_support=2, adapt_config=cfg).fit(P.astype(np.float32)).adapt(X.astype(np.float32), y)
    hc = clf.fewshot_["head_choice"]
    (pk, pl, truth), rows = seen["fit"], seen["ev"].rows
    assert np.array_equal(truth, y[rows])   # the mixture weight's images: the evidence's scored shots
    sample = heldout.shot_sample(y, select_max, 0)
    want = np.arange(len(y)) if sample is None else sample
    assert hc["shots_compared"] == len(rows) == len(want) and set(rows) == set(want)
    assert pk.shape == pl.shape == (len(rows), 12)
    assert hc["mixture_weight"] == pytest.approx(real_weight(pk, pl, y[rows])["weight"])
    assert clf.predict_proba(X.astype(np.float32)).shape == (12, 12)


def test_duplicate_shots_never_give_a_zero_bandwidth():
    """Copies of one image (the same file given twice) are no evidence of how far apart images are: the median
    distance ignores coincident pairs (mostly duplicates: σ from the distinct pairs), and shots that are all one
    image take the one-shot default σ = 1/√β instead of σ = 0 (which divided by zero when scoring)."""
    X, y, P = _problem(seed=2, C=3, per_class=1)
    dup = np.concatenate([X[:1]] * 4 + [X[1:2]])          # four copies of one shot and one other, both class 0
    assert ridge.median_distance(dup, 0, 1024) == pytest.approx(float(np.linalg.norm(X[0] - X[1])))
    assert ridge.median_distance(np.concatenate([X[:1]] * 3), 0, 1024) is None
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    clf.adapt(np.concatenate([X[:1]] * 2).astype(np.float32), np.array([0, 0]))   # all shots one image
    sel = clf.fewshot_["kernel"]
    assert sel["sigma"] == pytest.approx(1 / np.sqrt(DEFAULT.one_shot_beta))
    assert "every shot is the same image" in sel["selection"]["rule"]
    p = clf.predict_proba(X.astype(np.float32))
    assert np.isfinite(p).all() and np.allclose(p.sum(1), 1)
    clf.adapt(dup.astype(np.float32), np.zeros(5, dtype=np.int64))   # mostly duplicates: a finite, positive σ
    assert 0 < clf.fewshot_["kernel"]["sigma"] < np.inf and np.isfinite(clf.predict_proba(X.astype(np.float32))).all()


def test_one_shot_at_the_unpatched_subset_sizes():
    """The same at the shipped sizes, nothing patched: 600 classes × 1 shot (more than lda_loo_max = 512 shots, fewer
    than select_max = 1,024), the regime of ImageNet at one shot: every shot is left out once and judges."""

    C = 600
    assert DEFAULT.lda_loo_max < C <= DEFAULT.select_max
    X, y, P = _problem(seed=7, C=C, D=64, per_class=1, spread=0.6)
    clf = SVGClassifier(n_support=2, steps=5).fit(P.astype(np.float32)).adapt(X.astype(np.float32), y)
    assert clf.fewshot_["head_choice"]["shots_compared"] == C
    p = clf.predict_proba(X[:10].astype(np.float32))
    assert p.shape == (10, C) and np.allclose(p.sum(1), 1)


def test_every_grid_and_the_level_come_from_the_adapt_config(monkeypatch):
    """``adapt(config=...)`` reaches every choice: one-point grids are what the heads record, and the level is the
    one both paired tests use."""
    from svgen.core.support import image_rows
    from svgen.adapt import shots as shot_adapt

    X, y, P = _problem(seed=6, C=5, D=16, per_class=6)
    clf = SVGClassifier(n_support=2).fit(P.astype(np.float32))
    shots = image_rows(X.astype(np.float32), y, 5, X.shape[1])
    cfg = AdaptConfig(sigma_factors=(0.5,), ridges=(0.1,), lda_shrinkage=(0.4,), lda_prior=(2.0,), alphas=(0.0,))
    rec = shot_adapt.adapt(clf.zero_shot_, shots, clf._side(), config=cfg).record
    assert rec["kernel"]["selection"]["sigma_factor"] == 0.5 and rec["kernel"]["ridge_c"] == 0.1
    assert (rec["linear"]["shrinkage"], rec["linear"]["prior_shots"], rec["linear"]["alpha"]) == (0.4, 2.0, 0.0)
    assert rec["linear"]["grid"] == {"0": rec["linear"]["zero_shot_held_out_accuracy"]}
    # the level reaches every choice: each call of select.choose in the stages gets it
    from svgen.adapt import lda, temperatures

    seen = []
    for module in (residual, lda, temperatures):
        monkeypatch.setattr(module, "choose", lambda c, ev, name, level, real=module.choose:
                            seen.append((name, level)) or real(c, ev, name, level))
    rec = shot_adapt.adapt(clf.zero_shot_, shots, clf._side(), config=AdaptConfig(level=2.5)).record
    assert {name for name, _ in seen} >= {"kernel", "lda", "lda_prior", "alpha", "kernel_logits"}
    assert {level for _, level in seen} == {2.5} and "by more than 2.5 SE" in rec["kernel"]["decision"]["rule"]
