"""The held-out check that decides whether a pool may change the heads (svgen.transductive.gate), tested against
hand computations, and end to end: a pool that helps is kept, one that cannot help changes nothing."""

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.transductive import gate as pool_gate

C, D = 6, 24


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _world(seed, proto_noise, per_class, pool_noise, shots_per_class=0, shot_noise=None):
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(C, D)))
    protos = (centres + proto_noise * rng.normal(size=(C, D)) / np.sqrt(D)).astype(np.float32)
    yu = np.repeat(np.arange(C), per_class)
    U = _unit(centres[yu] + pool_noise * rng.normal(size=(len(yu), D)) / np.sqrt(D)).astype(np.float32)
    ys = np.repeat(np.arange(C), shots_per_class)
    X = _unit(centres[ys] + (shot_noise or pool_noise) * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    return protos, U, yu, X, ys


# ----------------------------------------------------------------------------- the pieces, by hand

@pytest.mark.parametrize("counts", [[1] * 7, [2] * 5, [4, 3, 1, 2, 5]])
def test_shot_folds_partition_and_balance(counts):
    y = np.concatenate([np.full(n, c) for c, n in enumerate(counts)])
    folds = pool_gate.shot_folds(y, len(counts), seed=3)
    assert len(folds) == 2
    assert np.array_equal(np.sort(np.concatenate(folds)), np.arange(len(y)))      # every shot once
    for c, n in enumerate(counts):
        held = [int((y[f] == c).sum()) for f in folds]
        assert abs(held[0] - held[1]) <= 1                                       # half of each class in each
    assert abs(len(folds[0]) - len(folds[1])) <= 1                                # odd ones alternate
    assert len(pool_gate.shot_folds(np.array([0]), 1)) == 1


@pytest.mark.parametrize("counts", [[3] * 5, [4, 3, 6, 5], [8, 8, 8]])
def test_shot_folds_hold_out_one_shot_per_class_with_three_or_more(counts):
    """Three or more shots in every class: each fold holds out at most one shot of each class (the fold's
    predictor keeps all the others); as many folds as the largest class has shots, at most MAX_FOLDS; no shot
    is held out twice."""
    from svgen.fewshot.residual import MAX_FOLDS

    y = np.concatenate([np.full(n, c) for c, n in enumerate(counts)])
    folds = pool_gate.shot_folds(y, len(counts), seed=3)
    assert len(folds) == min(max(counts), MAX_FOLDS)
    held = np.concatenate(folds)
    assert len(np.unique(held)) == len(held)                                     # never twice
    for f in folds:
        assert np.bincount(y[f], minlength=len(counts)).max() == 1               # one shot per class at most
    for c, n in enumerate(counts):
        assert int((y[held] == c).sum()) == min(n, MAX_FOLDS)


def test_paired_gate_by_hand():
    rep = 25                                             # 100 held-out images, four patterns
    y = np.tile([0, 1, 2, 0], rep)
    eye = np.eye(6)
    p_ind = 0.5 * eye[np.tile([1, 1, 2, 1], rep)] + 0.5 / 6            # right on 2 of 4
    p_pool = 0.5 * eye[np.tile([0, 1, 2, 1], rep)] + 0.5 / 6           # right on 3 of 4, same confidence
    g = pool_gate.paired_gate(p_ind, p_pool, y)
    assert g["adopt"] and g["top1"]["difference"] == pytest.approx(0.25)
    nll = lambda p: float(np.mean(-np.log(p[np.arange(len(y)), y])))           # noqa: E731
    assert g["nll"]["pool"] == pytest.approx(nll(p_pool)) and g["nll"]["inductive"] == pytest.approx(nll(p_ind))
    d = -np.log(p_pool[np.arange(len(y)), y]) + np.log(p_ind[np.arange(len(y)), y])
    assert g["nll"]["standard_error"] == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)))
    # the same argmaxes but the pool's probabilities nearly certain: more right, yet its NLL is far worse
    sharp = 0.999999 * eye[np.tile([0, 1, 2, 1], rep)] + 1e-6 / 6
    s = pool_gate.paired_gate(p_ind, sharp, y)
    assert not s["adopt"] and "NLL" in s["reason"]
    # equal top-1 is not "better"
    t = pool_gate.paired_gate(p_ind, p_ind, y)
    assert not t["adopt"] and "not above" in t["reason"]


def test_fit_stack_is_the_nll_minimum():
    """The weights against a brute-force grid over the same NLL, computed independently."""
    rng = np.random.default_rng(0)
    n = 300
    y = rng.integers(0, C, n)
    g = rng.normal(size=(n, C)) * 40 + 60 * np.eye(C)[y] * (rng.random(n) < 0.6)[:, None]   # informative, big scale
    z = rng.normal(size=(n, C)) + 1.5 * np.eye(C)[y]
    a, b = pool_gate.fit_stack([g, z], y)

    def nll(*w, parts=(g, z)):
        L = sum(wk * f for wk, f in zip(w, parts))
        L = L - L.max(1, keepdims=True)
        return float(np.mean(np.log(np.exp(L).sum(1)) - L[np.arange(n), y]))

    grid = [(ga, gb) for ga in np.linspace(0, 4 * a + 0.05, 81) for gb in np.linspace(0, 4 * b + 0.5, 81)]
    best = min(nll(*p) for p in grid)
    assert nll(a, b) <= best + 1e-6
    assert a > 0 and b > 0
    np.testing.assert_allclose(pool_gate.stacked_probs([g, z], (a, b)).sum(1), 1.0)
    # a useless g gets (almost) no weight: the inductive head alone
    a0, b0 = pool_gate.fit_stack([rng.normal(size=(n, C)) * 40, z], y)
    assert a0 * 40 < 0.05 and b0 > 0.5
    # three parts (the pool check's: Gaussian, LDA, zero-shot logits): a third informative part gets weight, and
    # the fit is at least as good as every point of a grid around it and as the two-part fit
    t = 30 * (rng.normal(size=(n, C)) + 1.0 * np.eye(C)[y])
    w = pool_gate.fit_stack([g, z, t], y)
    three = lambda *v: nll(*v, parts=(g, z, t))   # noqa: E731
    assert w[2] > 0 and three(*w) <= nll(a, b) + 1e-9
    grid3 = [(p, q, r) for p in np.linspace(0, 3 * w[0] + 0.02, 13) for q in np.linspace(0, 3 * w[1] + 0.2, 13)
             for r in np.linspace(0, 3 * w[2] + 0.02, 13)]
    assert three(*w) <= min(three(*v) for v in grid3) + 1e-6


def test_stack_and_mixture_weigh_the_kernel_head_against_the_stacked_head_by_nll():
    """The pool check's candidate: the stack's (a, b), then the kernel head's weight in the mixture with the stacked
    head, against a brute-force grid over the mixture's NLL computed independently; folds are cross-fitted."""
    rng = np.random.default_rng(3)
    n = 240
    y = rng.integers(0, C, n)
    g = rng.normal(size=(n, C)) * 10 + 12 * np.eye(C)[y] * (rng.random(n) < 0.5)[:, None]
    z = rng.normal(size=(n, C)) + 1.2 * np.eye(C)[y]
    pk = rng.dirichlet(np.full(C, 0.4), size=n)
    pk[np.arange(n), y] += rng.random(n)
    pk /= pk.sum(1, keepdims=True)
    rows = np.arange(n)
    folds = [rows[:120], rows[120:]]
    parts = [(f, None, (g[f], z[f]), pk[f]) for f in folds]
    (a, b), w = pool_gate.stack_and_mixture(parts, y)
    assert (a, b) == pytest.approx(pool_gate.fit_stack([g, z], y))
    ps = pool_gate.stacked_probs([g, z], (a, b))
    grid = np.linspace(0, 1, 10001)
    nll = -np.log(grid[:, None] * pk[rows, y] + (1 - grid[:, None]) * ps[rows, y]).mean(1)
    assert w == pytest.approx(grid[np.argmin(nll)], abs=2e-4) and 0 < w < 1
    mixed = pool_gate.mixed_probs(parts[0], (a, b), w)
    np.testing.assert_allclose(mixed, w * pk[:120] + (1 - w) * ps[:120], rtol=1e-12)
    # each fold's weights from the other fold alone
    (a1, b1), w1 = pool_gate.stack_and_mixture(parts[1:], y)
    assert (a1, b1) == pytest.approx(pool_gate.fit_stack([g[120:], z[120:]], y[120:]))


def test_replication_gate_by_hand():
    ones, zeros = np.ones(40, bool), np.zeros(40, bool)
    more = np.r_[ones[:30], zeros[:10]]
    g = pool_gate.replication_gate(more, np.r_[ones[:20], zeros[:20]], ones, ones)
    assert g["adopt"] and g["difference"] == pytest.approx(0.25)
    same = pool_gate.replication_gate(more, more, ones, ones)
    assert not same["adopt"] and "does not replicate" in same["reason"]
    top5_lost = pool_gate.replication_gate(ones, zeros, zeros, ones)
    assert not top5_lost["adopt"] and "top 5" in top5_lost["reason"]


# ----------------------------------------------------------------------------- end to end

def _same_heads(a, b, X):
    for head in ("kernel", "linear", "cosine"):
        np.testing.assert_array_equal(a.decision_function(X, head), b.decision_function(X, head))
        np.testing.assert_allclose(a.predict_proba(X, head), b.predict_proba(X, head), rtol=0, atol=0)


def test_pool_that_cannot_help_changes_nothing():
    """Zero-shot, a pool of one image per class from noise far wider than the classes: the halves find
    nothing in common, and every head stays exactly the inductive one."""
    protos, U, _, _, _ = _world(1, 0.3, 2, 6.0)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    ref = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    clf.adapt(unlabelled=U)
    t = clf.transductive_
    assert t["fallback"] and "kept the inductive heads" in t["fallback"]
    assert t["check"]["evidence"] == "halves of the pool" and not t["check"]["adopt"]
    assert clf.default_head_ == ref.default_head_ == "kernel"
    _same_heads(clf, ref, U)


def test_zero_shot_pool_with_real_structure_is_kept(tmp_path):
    """Prototypes far off tight clusters: both halves find the clusters; the adapted linear head is deployed
    at the inductive head's entropy, and it travels through save/load."""
    protos, U, yu, _, _ = _world(7, 1.6, 30, 0.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    acc0 = (clf.predict(U) == np.array(clf.classes_)[yu]).mean() if clf.classes_ else None
    clf.adapt(unlabelled=U)
    t = clf.transductive_
    assert t["fallback"] is None and t["check"]["adopt"], t.get("check")
    assert clf.default_head_ == "linear" and clf.calibration_["method"] == "entropy-matched"
    assert (clf.predict(U) == np.array(clf.classes_)[yu]).mean() > acc0
    back = SVGClassifier.load(clf.save(tmp_path / "p.svgen"))
    assert back.default_head_ == "linear"
    np.testing.assert_allclose(back.predict_proba(U), clf.predict_proba(U), rtol=1e-5, atol=1e-7)


def test_a_resolved_kernel_head_is_scored_by_its_scores_at_the_inductive_entropy():
    """A kept zero-shot pool re-solves the kernel vote with pool rows. Its ridge scores have either sign, so its
    probabilities are ``softmax(score / T)`` ("score" logits; ``log max(score, 1e-30)`` put every class scored ≤ 0
    at 1e-30: on real ucf101 features its NLL was twice the inductive head's), with T giving it the inductive default
    head's mean entropy on the pool."""
    from scipy.special import softmax
    from svgen.transductive.solve import calibration_rows

    protos, U, yu, _, _ = _world(7, 1.6, 30, 0.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    rows = calibration_rows(len(U)).numpy()
    p_before = clf.predict_proba(U)[rows]
    clf.adapt(unlabelled=U)
    assert clf.transductive_["kernel_head"]["replaced"] and clf.kernel_logits_ == "score"
    s = np.asarray(clf.decision_function(U, "kernel"), dtype=np.float64)
    p = clf.predict_proba(U, head="kernel")
    np.testing.assert_allclose(p, softmax(s / clf.temperatures_["kernel"], axis=1), rtol=1e-4, atol=1e-7)

    def entropy(q):
        return float(-(q * np.log(np.maximum(q, 1e-300))).sum(axis=1).mean())

    assert entropy(p[rows]) == pytest.approx(entropy(p_before), rel=1e-3)


def test_pool_with_shots_stacked_head_formula():
    """With shots, a kept pool deploys ``a·G + b·(inductive linear logits)``: recomputed from the transduction's
    parts (G: the transduced head minus β·t × the LDA part the solve continued)."""
    protos, U, yu, X, ys = _world(7, 1.6, 30, 0.5, shots_per_class=8, shot_noise=1.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    W0, b0 = clf.linear_weight_.clone(), clf.linear_bias_.clone()
    acc_ind = float((clf.predict(U) == np.array(clf.classes_)[yu]).mean())
    K0 = clf.decision_function(U, "kernel")
    clf.adapt(unlabelled=U)
    t = clf.transductive_
    assert t["fallback"] is None and t["check"]["evidence"] == "held-out shots as pool members"
    assert t["check"]["images"] == len(np.concatenate(pool_gate.shot_folds(ys, C, 0)))   # 4 of each class's 8
    a, b = t["check"]["stack"]["gaussian"], t["check"]["stack"]["inductive_linear"]
    # the parts: the posterior head is W_G + β·t·W0; take the inductive part back out
    k = t["prior_strength"] * t["linear_prior_temperature"]
    ref = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    from svgen.transductive.pool import transduce

    pool = transduce(ref._stage(), ref._side(), torch.nn.functional.normalize(torch.as_tensor(U), dim=-1))
    # the solve continued the LDA part of the inductive linear head (zero-shot logits + α·s·LDA logits,
    # svgen.fewshot.linear), refitted here from the shots at the recorded settings
    from svgen.core.support import IMAGE
    from svgen.fewshot.lda import lda_head_weights, prior_means

    rec = ref.fewshot_["linear"]
    assert rec["form"] != "lda" and rec["alpha"] > 0
    Xd, ylab = ref.support_set_.part(IMAGE).rows.double(), ref.support_set_.part(IMAGE).labels
    Wl, bl = lda_head_weights(Xd, ylab, prior_means(ref.prototypes_, Xd), rec["shrinkage"], rec["prior_shots"],
                              equal_radius=True)
    Pn = torch.nn.functional.normalize(ref.prototypes_.double(), dim=-1)
    np.testing.assert_allclose(W0.double(), 100.0 * Pn + rec["alpha"] * rec["scale"] * Wl, rtol=1e-4, atol=1e-4)
    WG = pool.heads.linear.weight.double() - k * Wl.float().double()
    bG = pool.heads.linear.bias.double() - k * bl.float().double()
    # the stack mixes the pool's Gaussian part with the inductive linear head (zero-shot + α·s·LDA logits)
    Un = torch.nn.functional.normalize(torch.as_tensor(U).double(), dim=-1)
    want = Un @ (a * WG + b * W0.double()).T + (a * bG + b * b0.double())
    np.testing.assert_allclose(clf.decision_function(U, "linear"), want.numpy(), rtol=1e-4, atol=1e-4)
    assert clf.temperatures_["linear"] == 1.0
    np.testing.assert_array_equal(clf.decision_function(U, "kernel"), K0)          # the kernel head stays
    # deployed: the mixture of the kernel head and the stacked head at the check's weight (0: the stacked head)
    w = t["check"]["mixture_weight"]
    assert clf.default_head_ == ("kernel" if w == 1 else "linear" if w == 0 else "mixture")
    p_lin = torch.softmax(want, dim=1).numpy()
    np.testing.assert_allclose(clf.predict_proba(U), w * clf.predict_proba(U, "kernel") + (1 - w) * p_lin, atol=1e-5)
    assert float((clf.predict(U) == np.array(clf.classes_)[yu]).mean()) >= acc_ind
    np.testing.assert_allclose(np.asarray(clf.transductive_labels_), clf.predict_proba(U), atol=1e-5)


def test_pool_with_shots_refused_keeps_every_head(monkeypatch):
    """When the held-out shots say no, nothing changes: every head and probability is the inductive one."""
    protos, U, _, X, ys = _world(3, 0.5, 10, 0.9, shots_per_class=2, shot_noise=0.9)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    ref = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    real = pool_gate.paired_gate
    monkeypatch.setattr(pool_gate, "paired_gate", lambda *a: {**real(*a), "adopt": False, "reason": "said no"})
    clf.adapt(unlabelled=U)
    assert clf.transductive_["fallback"] == "said no; kept the inductive heads"
    assert clf.default_head_ == ref.default_head_
    _same_heads(clf, ref, U)
    # the pool's printed probabilities are then the inductive default head's, as classify prints them
    np.testing.assert_allclose(np.asarray(clf.transductive_labels_), ref.predict_proba(U), rtol=1e-5, atol=1e-7)


def test_the_check_shows_progress_when_asked(capsys):
    protos, U, _, _, _ = _world(7, 1.6, 30, 0.5)
    SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt_pool(U, progress=True)
    assert "checking the pool (halves of the pool)" in capsys.readouterr().err
    SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt_pool(U, progress=False)
    assert "checking the pool" not in capsys.readouterr().err


def test_cli_says_what_the_pool_changed(cli, tmp_path):
    """``svgen adapt`` says in one line whether the pool was kept, and why not; the summary carries the check."""
    import json

    protos, U, _, _, _ = _world(1, 0.3, 2, 6.0)
    np.save(tmp_path / "P.npy", protos)
    np.save(tmp_path / "U.npy", U)
    (tmp_path / "classes.txt").write_text("".join(f"c{i}\n" for i in range(C)))
    assert cli("fit", "--prototypes", tmp_path / "P.npy", "--classes", tmp_path / "classes.txt", "-K", "2",
               "--steps", "5", "--out", tmp_path / "zs.svgen")[0] == 0
    code, out, err = cli("adapt", tmp_path / "zs.svgen", "--unlabelled-features", tmp_path / "U.npy",
                         "--out", tmp_path / "p.svgen")
    assert code == 0, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("the pool changed nothing: ") and "kept the inductive heads" in last
    summary = json.loads(out)["transductive"]
    assert summary["default_head"] == "kernel" and summary["check"]["adopt"] is False
    assert summary["check"]["evidence"] == "halves of the pool"
    # classify --transductive on the same pool: the inductive default head's probabilities, and it says so
    code, out, err = cli("classify", tmp_path / "zs.svgen", "--features", tmp_path / "U.npy", "--transductive",
                         "-k", "1", "--out", tmp_path / "t.csv")
    assert code == 0, err
    assert "inductive default head (the pool changed nothing) probabilities" in err


def test_an_artifact_whose_pool_changed_nothing_loads_and_classifies(cli, tmp_path):
    """Regression: svgen.json's schema typed ``transductive.fallback`` as true/false while svgen writes the
    reason, so an artifact adapted to a refused pool could not be loaded again (classify: 'must be true or
    false, got a string')."""
    protos, U, _, _, _ = _world(1, 0.3, 2, 6.0)
    np.save(tmp_path / "P.npy", protos)
    np.save(tmp_path / "U.npy", U)
    (tmp_path / "classes.txt").write_text("".join(f"c{i}\n" for i in range(C)))
    assert cli("fit", "--prototypes", tmp_path / "P.npy", "--classes", tmp_path / "classes.txt", "-K", "2",
               "--steps", "5", "--unlabelled-features", tmp_path / "U.npy", "--out", tmp_path / "p.svgen")[0] == 0
    back = SVGClassifier.load(tmp_path / "p.svgen")
    assert "kept the inductive heads" in back.transductive_["fallback"]
    code, out, err = cli("classify", tmp_path / "p.svgen", "--features", tmp_path / "U.npy", "-k", "1")
    assert code == 0, err
    assert len(out.strip().splitlines()) == len(U) + 1          # a header and one row per image


def test_diagnose_says_what_the_pool_decided(cli, tmp_path):
    protos, U, _, X, ys = _world(7, 1.6, 30, 0.5, shots_per_class=8, shot_noise=1.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos, classes=[f"c{i}" for i in range(C)])
    clf.adapt(X, ys, unlabelled=U).save(tmp_path / "p.svgen")
    code, out, err = cli("diagnose", tmp_path / "p.svgen")
    assert code == 0, err
    line = next(l for l in out.splitlines() if "transductive pool of" in l)
    assert "kept on held-out shots as pool members" in line and "linear head stacked: " in line
    assert line.endswith("default head: linear")
