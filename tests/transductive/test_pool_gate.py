"""The held-out check that decides whether a pool may change the heads (svgen.adapt.gate), tested against
hand computations, and end to end: a pool that helps is kept, one that cannot help changes nothing."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from svgen import SVGClassifier, records
from svgen.adapt import gate as pool_gate
from svgen.adapt.config import DEFAULT
from svgen.adapt.gate import TOP1, TOP5

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
    folds = pool_gate.shot_folds(y, len(counts), 3, DEFAULT.max_folds)
    assert len(folds) == 2
    assert np.array_equal(np.sort(np.concatenate(folds)), np.arange(len(y)))      # every shot once
    for c, n in enumerate(counts):
        held = [int((y[f] == c).sum()) for f in folds]
        assert abs(held[0] - held[1]) <= 1                                       # half of each class in each
    assert abs(len(folds[0]) - len(folds[1])) <= 1                                # odd ones alternate
    assert len(pool_gate.shot_folds(np.array([0]), 1, 0, DEFAULT.max_folds)) == 1


@pytest.mark.parametrize("counts", [[3] * 5, [4, 3, 6, 5], [8, 8, 8]])
def test_shot_folds_hold_out_one_shot_per_class_with_three_or_more(counts):
    """Three or more shots in every class: each fold holds out at most one shot of each class (the fold's
    predictor keeps all the others); as many folds as the largest class has shots, at most MAX_FOLDS; no shot
    is held out twice."""
    from svgen.adapt.config import DEFAULT

    y = np.concatenate([np.full(n, c) for c, n in enumerate(counts)])
    folds = pool_gate.shot_folds(y, len(counts), 3, DEFAULT.max_folds)
    assert len(folds) == min(max(counts), DEFAULT.max_folds)
    held = np.concatenate(folds)
    assert len(np.unique(held)) == len(held)                                     # never twice
    for f in folds:
        assert np.bincount(y[f], minlength=len(counts)).max() == 1               # one shot per class at most
    for c, n in enumerate(counts):
        assert int((y[held] == c).sum()) == min(n, DEFAULT.max_folds)


def test_paired_gate_by_hand():
    rep = 25                                             # 100 held-out images, four patterns
    y = np.tile([0, 1, 2, 0], rep)
    eye = np.eye(6)
    p_ind = 0.5 * eye[np.tile([1, 1, 2, 1], rep)] + 0.5 / 6            # right on 2 of 4
    p_pool = 0.5 * eye[np.tile([0, 1, 2, 1], rep)] + 0.5 / 6           # right on 3 of 4, same confidence
    g = pool_gate.paired_gate(p_ind, p_pool, y, DEFAULT.level)
    assert g.passed and g.top1.difference == pytest.approx(0.25)
    nll = lambda p: float(np.mean(-np.log(p[np.arange(len(y)), y])))           # noqa: E731
    assert g.nll.candidate == pytest.approx(nll(p_pool)) and g.nll.baseline == pytest.approx(nll(p_ind))
    d = -np.log(p_pool[np.arange(len(y)), y]) + np.log(p_ind[np.arange(len(y)), y])
    assert g.nll.standard_error == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)))
    # the same argmaxes but the pool's probabilities nearly certain: more right, yet its NLL is far worse
    sharp = 0.999999 * eye[np.tile([0, 1, 2, 1], rep)] + 1e-6 / 6
    s = pool_gate.paired_gate(p_ind, sharp, y, DEFAULT.level)
    assert not s.passed and "NLL" in s.message
    # equal top-1 is not "better"
    t = pool_gate.paired_gate(p_ind, p_ind, y, DEFAULT.level)
    assert not t.passed and "not above" in t.message


def _right_on(n_right, n=24):
    """Probabilities right (class 0) on the first ``n_right`` of ``n`` images and wrong (class 1) elsewhere, all at
    the same confidence: only top-1 differs between two of them."""
    return 0.5 * np.eye(6)[np.where(np.arange(n) < n_right, 0, 1)] + 0.5 / 6


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("level", [0.5, 1.0, 2.0])
def test_the_pool_test_is_the_selection_test(seed, level):
    """One significance convention (issue 38): the pool is kept iff the inductive predictor is behind it on top-1
    (:func:`svgen.adapt.select.ahead`) and it is not behind on top-5 nor on −NLL (:func:`svgen.adapt.select.behind`), all
    at one level, with the paired means and SEs of :func:`svgen.adapt.select.paired`."""
    from svgen.adapt.select import ahead, behind, paired

    rng = np.random.default_rng(seed)
    n = 60
    y = rng.integers(0, 6, n)
    p_ind = rng.dirichlet(np.ones(6), n)
    p_pool = 0.6 * p_ind + 0.4 * np.eye(6)[np.where(rng.random(n) < 0.7, y, rng.integers(0, 6, n))]
    g = pool_gate.paired_gate(p_ind, p_pool, y, level)

    def per_image(p):
        top = np.argsort(-p, axis=1)
        return (top[:, 0] == y), (top[:, :5] == y[:, None]).any(1), -np.log(p[np.arange(n), y])

    (a1, a5, an), (b1, b5, bn) = per_image(p_ind), per_image(p_pool)
    assert g.top1 == paired(b1, a1) and g.top5 == paired(b5, a5) and g.nll == paired(bn, an)
    want = ahead(paired(b1, a1), level) and not behind(paired(b5, a5), level) and not behind(paired(-bn, -an), level)
    assert g.passed == want
    assert records.gate(g)["rule"].count(f"by more than {level:g} SE") == 2 and "sign" not in json.dumps(records.gate(g))


def test_a_tie_is_not_ahead_and_the_level_is_the_configs():
    """3 shots gained and 1 lost of 24 is exactly 1 SE ahead (d = 1/12, SE = 1/12): a tie, so the pool is refused at
    level 1; 4 gained and 0 lost (d = 1/6, SE = 0.078, 2.1 SE) is kept at level 1 and 2, refused at 2.5."""
    y = np.zeros(24, dtype=int)
    ind = _right_on(20)
    pool = _right_on(20).copy()
    pool[20:23] = _right_on(24)[20:23]    # gains the shots 20-22 ...
    pool[0] = _right_on(0)[0]             # ... and loses shot 0
    tie = pool_gate.paired_gate(ind, pool, y, DEFAULT.level)
    assert tie.top1.difference == pytest.approx(tie.top1.standard_error, rel=1e-12)
    assert (tie.gained, tie.lost) == (3, 1) and not tie.passed and "not above" in tie.message
    for level, kept in ((1.0, True), (2.0, True), (2.5, False)):
        assert pool_gate.paired_gate(_right_on(20), _right_on(24), y, level).passed is kept, level
    too_few = pool_gate.paired_gate(_right_on(20), _right_on(24), y, 2.5)
    assert "by more than 2.5 SE" in too_few.message and "2.5 SE" in records.gate(too_few)["rule"]


def _nll(L, y):
    L = L - L.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(L).sum(1)) - L[np.arange(len(y)), y]))


def test_fit_pool_weight_is_the_nll_minimum():
    """The power against a brute-force grid over the same NLL, computed independently; a useless likelihood gets
    (almost) none, one that only hurts gets exactly none."""
    rng = np.random.default_rng(0)
    n = 300
    y = rng.integers(0, C, n)
    g = rng.normal(size=(n, C)) * 40 + 60 * np.eye(C)[y] * (rng.random(n) < 0.6)[:, None]   # informative, big scale
    z = rng.normal(size=(n, C)) + 1.5 * np.eye(C)[y]
    a = pool_gate.fit_pool_weight(g, z, y)
    grid = np.linspace(0, 4 * a, 4001)
    nll = [_nll(z + t * g, y) for t in grid]
    assert a > 0 and _nll(z + a * g, y) <= min(nll) + 1e-9
    assert a == pytest.approx(grid[int(np.argmin(nll))], abs=2 * (grid[1] - grid[0]))
    # the slope at the optimum is zero: a second formula (finite differences of the NLL)
    h = 1e-6 * a
    assert abs(_nll(z + (a + h) * g, y) - _nll(z + (a - h) * g, y)) / (2 * h) < 1e-3
    np.testing.assert_allclose(pool_gate.factored_probs(z, g, a).sum(1), 1.0)
    assert pool_gate.fit_pool_weight(rng.normal(size=(n, C)) * 40, z, y) * 40 < 0.05
    anti = -g   # the likelihood points away from the labels: a = 0, the head as it was
    assert pool_gate.fit_pool_weight(anti, z, y) == 0.0
    np.testing.assert_allclose(pool_gate.factored_probs(z, anti, 0.0), pool_gate.factored_probs(z, g, 0.0))


def test_the_power_is_fitted_against_calibrated_log_probabilities():
    """The factor multiplies the head's calibrated probabilities: a head whose logits are rescaled (a different T)
    but whose log-probabilities are the same gets the same power — (a, b) fitted on raw logits did not, which let a
    fold's weak linear head give the pool's likelihood all the weight (dev data, one shot per class: top-5 −2.5)."""
    rng = np.random.default_rng(4)
    n = 400
    y = rng.integers(0, C, n)
    g = 20 * (rng.normal(size=(n, C)) + 0.8 * np.eye(C)[y])
    z = 2 * (rng.normal(size=(n, C)) + 1.2 * np.eye(C)[y])
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    assert pool_gate.fit_pool_weight(g, z, y) == pytest.approx(pool_gate.fit_pool_weight(g, logp, y), rel=1e-5)


def test_the_halves_gate_by_hand():
    def halves(agree_pool, agree_ind, agree5_pool, agree5_ind):   # per image: the posterior class in top 1, top 5
        return pool_gate.decided({TOP1: agree_pool, TOP5: agree5_pool}, {TOP1: agree_ind, TOP5: agree5_ind},
                                 DEFAULT.level)

    ones, zeros = np.ones(40, bool), np.zeros(40, bool)
    more = np.r_[ones[:30], zeros[:10]]
    g = halves(more, np.r_[ones[:20], zeros[:20]], ones, ones)
    assert g.passed and g.top1.difference == pytest.approx(0.25)
    same = halves(more, more, ones, ones)
    assert not same.passed and "does not replicate" in same.message
    top5_lost = halves(ones, zeros, zeros, ones)
    assert not top5_lost.passed and "top 5" in top5_lost.message


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
    at the pool check's agreement (mean top-1 probability on the pool), and it travels through save/load."""
    protos, U, yu, _, _ = _world(7, 1.6, 30, 0.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    acc0 = (clf.predict(U) == np.array(clf.classes_)[yu]).mean() if len(clf.classes_) else None
    clf.adapt(unlabelled=U)
    t = clf.transductive_
    assert t["fallback"] is None and t["check"]["adopt"], t.get("check")
    assert clf.default_head_ == "linear" and clf.calibration_["method"] == "confidence-matched"
    assert (clf.predict(U) == np.array(clf.classes_)[yu]).mean() > acc0
    back = SVGClassifier.load(clf.save(tmp_path / "p.svgen"))
    assert back.default_head_ == "linear"
    np.testing.assert_allclose(back.predict_proba(U), clf.predict_proba(U), rtol=1e-5, atol=1e-7)


def test_zero_shot_pool_kernel_head_is_the_posterior_with_the_kernel_prior(tmp_path):
    """A kept zero-shot pool deploys, as the kernel head, the transduction's posterior with the kernel vote as its
    prior: ``softmax(t·(β·t_p·s(x) + x̂ W_Gᵀ + b_G))``, s the inductive kernel scores, recomputed here from the
    transduction's parts (W_G: the transduced linear head minus β·t_l × the inductive one), with t giving it the
    pool check's agreement as its mean top-1 probability on the pool; the kernel's rows and votes are the inductive
    ones, and it
    travels through save/load (format 6)."""
    from scipy.special import softmax

    from svgen.io.artifacts import FORMAT_VERSION_POOL_FACTOR
    from svgen.adapt.transduce import score, transduce
    from svgen.heads.calibration import calibration_rows

    protos, U, yu, _, _ = _world(7, 1.6, 30, 0.5)
    ref = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos)
    rows = calibration_rows(len(U)).numpy()
    p_before = clf.predict_proba(U)[rows]
    s = np.asarray(ref.decision_function(U, "kernel"), dtype=np.float64)
    clf.adapt(unlabelled=U)
    t = clf.transductive_
    assert t["fallback"] is None and t["kernel_head"]["factor"] and set(t["pool_factor"]["powers"]) == {"kernel"}
    Uu = torch.nn.functional.normalize(torch.as_tensor(U), dim=-1)
    pool = transduce(ref._stage(), ref._side(), Uu, score(ref._stage(), ref._side(), Uu), ref.adapt_config_)
    rec = pool.record
    kl = rec["prior_strength"] * rec["linear_prior_temperature"]
    WG = pool.heads.linear.weight.double() - kl * pool.prior_linear.weight.double()
    bG = pool.heads.linear.bias.double() - kl * pool.prior_linear.bias.double()
    Un = torch.nn.functional.normalize(torch.as_tensor(U).double(), dim=-1)
    z = rec["prior_strength"] * rec["prior_temperature"] * s + (Un @ WG.T + bG).numpy()

    def entropy(q):
        return float(-(q * np.log(np.maximum(q, 1e-300))).sum(axis=1).mean())

    a = t["pool_factor"]["powers"]["kernel"]
    p = clf.predict_proba(U, head="kernel")
    np.testing.assert_allclose(p, softmax(a * z, axis=1), rtol=1e-4, atol=1e-7)
    check = t["check"]
    k, n = check["agreement_pool"] * check["images"], check["images"]
    assert p[rows].max(axis=1).mean() == pytest.approx((k + 1) / (n + 2), abs=1e-4)
    assert entropy(p[rows]) < entropy(p_before)   # the pool is sharper than the inductive head: it claims so
    assert clf.predict(U, head="kernel").tolist() == np.array(clf.classes_)[z.argmax(axis=1)].tolist()
    assert torch.equal(clf.heads_.kernel.votes, ref.heads_.kernel.votes)   # the vote is not re-solved
    path = clf.save(tmp_path / "k.svgen")
    assert json.loads((path / "svgen.json").read_text())["format_version"] == FORMAT_VERSION_POOL_FACTOR
    back = SVGClassifier.load(path)
    for h in ("kernel", "linear"):
        np.testing.assert_allclose(back.predict_proba(U, h), clf.predict_proba(U, h), rtol=1e-5, atol=1e-7)
    back.adapt(unlabelled=U[:3])   # refused (fewer images than classes): the inductive heads come back
    np.testing.assert_allclose(back.predict_proba(U, "kernel"), ref.predict_proba(U, "kernel"), rtol=1e-4, atol=1e-6)


def test_pool_with_shots_factor_formula(tmp_path):
    """With shots, a kept pool multiplies the default head and the linear head by the pool's Gaussian class
    likelihood to the powers the check fitted: ``softmax(log p⁰ + a·G)``, recomputed here from the transduction's parts
    (G: the transduced head minus β·t × the LDA part the solve continued) and the inductive heads' own probabilities;
    the kernel head (not the default here) stays; the factor travels through save/load (format 6)."""
    from scipy.special import softmax

    from svgen.io.artifacts import FORMAT_VERSION_POOL_FACTOR

    protos, U, yu, X, ys = _world(7, 1.6, 30, 0.5, shots_per_class=8, shot_noise=1.5)
    ref = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    head = clf.default_head_
    p0 = {h: ref.predict_proba(U, h) for h in ref.head_names_}
    acc_ind = float((clf.predict(U) == np.array(clf.classes_)[yu]).mean())
    clf.adapt(unlabelled=U)
    t = clf.transductive_
    assert t["fallback"] is None and t["check"]["evidence"] == "held-out shots as pool members"
    assert t["check"]["images"] == len(np.concatenate(pool_gate.shot_folds(ys, C, 0, DEFAULT.max_folds)))   # one shot of each class
    powers = t["pool_factor"]["powers"]
    assert head in powers and "kernel" not in powers and clf.default_head_ == head
    from svgen.adapt.transduce import score, transduce

    Uu = torch.nn.functional.normalize(torch.as_tensor(U), dim=-1)
    pool = transduce(ref._stage(), ref._side(), Uu, score(ref._stage(), ref._side(), Uu), ref.adapt_config_)
    k = pool.record["prior_strength"] * pool.record["linear_prior_temperature"]
    WG = pool.heads.linear.weight.double() - k * pool.prior_linear.weight.double()
    bG = pool.heads.linear.bias.double() - k * pool.prior_linear.bias.double()
    Un = torch.nn.functional.normalize(torch.as_tensor(U).double(), dim=-1)
    G = (Un @ WG.T + bG).numpy()
    for h, a in powers.items():
        want = softmax(np.log(np.maximum(p0[h], 1e-30)) + a * G, axis=1)
        np.testing.assert_allclose(clf.predict_proba(U, h), want, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(softmax(np.asarray(clf.decision_function(U, h), dtype=np.float64), axis=1), want,
                                   rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(clf.predict_proba(U, "kernel"), p0["kernel"])          # the kernel head stays
    assert float((clf.predict(U) == np.array(clf.classes_)[yu]).mean()) >= acc_ind
    np.testing.assert_allclose(np.asarray(clf.transductive_labels_), clf.predict_proba(U), atol=1e-5)
    path = clf.save(tmp_path / "f.svgen")
    assert json.loads((path / "svgen.json").read_text())["format_version"] == FORMAT_VERSION_POOL_FACTOR
    back = SVGClassifier.load(path)
    for h in back.head_names_:
        np.testing.assert_allclose(back.predict_proba(U, h), clf.predict_proba(U, h), rtol=1e-5, atol=1e-7)
    back.adapt(unlabelled=U[:C - 1])   # falls back: the factor is dropped, the inductive heads are back
    for h in back.head_names_:
        np.testing.assert_allclose(back.predict_proba(U, h), p0[h], rtol=1e-5, atol=1e-7)


def test_pool_with_shots_refused_keeps_every_head(monkeypatch):
    """When the held-out shots say no, nothing changes: every head and probability is the inductive one."""
    protos, U, _, X, ys = _world(3, 0.5, 10, 0.9, shots_per_class=2, shot_noise=0.9)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    ref = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, ys)
    real = pool_gate.paired_gate
    monkeypatch.setattr(pool_gate, "paired_gate", lambda *a, **k: replace(real(*a, **k), failed=("said no",)))
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
    assert "kept on held-out shots as pool members" in line and "× the pool's class likelihood to a power: " in line
    powers = clf.transductive_["pool_factor"]["powers"]
    assert all(f"{h} head^{a:.3g}" in line for h, a in powers.items()) and "kernel head^" not in line
    assert line.endswith(f"default head: {clf.default_head_}")


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "onnx"])
def test_every_export_of_a_head_with_a_pool_factor_is_that_head(tmp_path, fmt):
    """After a pool with shots (the golden format-6 artifact: the default mixture head and the linear head carry the
    pool's factor, the kernel head none; and the same with the factor on its kernel head instead, floored logits, as
    when the kernel head is the default) and after a zero-shot pool (the kernel head's scores × the factor), each
    exported head file gives the probabilities and scores svgen gives —
    read by the deployment script without svgen — and the linear head stays one matrix (the factor folded in, T = 1)."""
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    import sys
    from pathlib import Path

    from svgen.io.export import export_head, load_head

    root = Path(__file__).resolve().parents[2]
    clf = SVGClassifier.load(root / "tests" / "io" / "golden" / "v6_shots_pool_kept" / "artifact")
    powers = clf.heads_.pool_factor.powers
    assert set(powers) == {"mixture", "linear"} and clf.default_head_ == "mixture"
    sys.path.insert(0, str(root / "scripts"))
    import zero_shot_classify

    Q = 3.0 * np.load(root / "tests" / "io" / "golden" / "v6_shots_pool_kept" / "queries.npy")   # raw, not unit
    kernel_default = SVGClassifier.load(root / "tests" / "io" / "golden" / "v6_shots_pool_kept" / "artifact")
    kernel_default.heads_.pool_factor.powers = {"kernel": 0.7 * powers["mixture"]}   # a kernel head (floored logits)
    assert kernel_default.kernel_logits_ == "floored"                                # with the factor, as the default
    # after a zero-shot pool: the kernel head's scores ("score" logits) × the pool's likelihood
    zero_shot = SVGClassifier.load(root / "tests" / "io" / "golden" / "v6_zero_shot_pool_kept" / "artifact")
    assert set(zero_shot.heads_.pool_factor.powers) == {"kernel"} and zero_shot.kernel_logits_ == "score"
    for i, (model, head) in enumerate(((clf, "mixture"), (clf, "linear"), (clf, "kernel"), (kernel_default, "kernel"),
                                       (zero_shot, "kernel"), (zero_shot, "linear"))):
        path = tmp_path / f"{head}{i}.{fmt}"
        info = export_head(model, path, fmt, head=head)
        got = zero_shot_classify.load_head(str(path))
        # ONNX runs in float32, and the factor's log-likelihood (scale ~10²) costs it a digit; so do the zero-shot
        # kernel head's scores at their small T (×1/T ~ 10)
        np.testing.assert_allclose(got["probs"](Q), model.predict_proba(Q, head),
                                   atol=1e-5 if fmt == "onnx" or model is zero_shot else 2e-6, err_msg=head)
        np.testing.assert_allclose(got["score"](Q), model.decision_function(Q, head), atol=2e-4, err_msg=head)
        if fmt == "onnx":
            assert info["checked"] is not None
            continue
        h = load_head(path)
        assert ("pool_factor.power" in h) == (head in model.heads_.pool_factor.powers and head != "linear")
        if head == "linear":   # one matrix: softmax(logit_scale·(x̂ W + b) / T), T = 1 where the factor is folded in
            x = Q / np.linalg.norm(Q, axis=1, keepdims=True)
            z = float(h["logit_scale"]) * (x @ h["weight"] + h["bias"])
            assert (float(h["temperature"]) == 1.0) == ("linear" in model.heads_.pool_factor.powers)
            np.testing.assert_allclose(_softmax_np(z / float(h["temperature"])), model.predict_proba(Q, "linear"),
                                       atol=2e-5)


def _softmax_np(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("change, message", [
    (lambda m, t: m.update(format_version=4), "only valid in format version 6"),
    (lambda m, t: m["calibration"].update(pool_factor_powers={"kernel": -1.0}), "positive numbers"),
    (lambda m, t: m["calibration"].update(pool_factor_powers={"ensemble": 1.0}), "must map some of the heads"),
    (lambda m, t: m["calibration"].pop("pool_factor_powers"), "must map some of the heads"),
    (lambda m, t: t.pop("pool_factor.bias"), "pool_factor.bias must have shapes"),
    (lambda m, t: t.update({"pool_factor.weight": t["pool_factor.weight"][:, :3].contiguous()}), "must have shapes"),
    (lambda m, t: t["pool_factor.weight"].fill_(float("nan")), "pool_factor.weight contains NaN"),
    (lambda m, t: t.update({"lda.weight": t["lda.weight"][:3].contiguous()}), "lda.weight and lda.bias must have"),
    (lambda m, t: t.pop("lda.bias"), "lda.weight and lda.bias must have"),
    (lambda m, t: m.pop("lda"), "with svgen.json 'lda'"),
    (lambda m, t: m["lda"].update(shrinkage=1.5), "'lda.shrinkage' must be"),
    (lambda m, t: m["lda"].update(temperature=-1.0), "'lda.temperature' must be"),
])
def test_a_damaged_pool_factor_is_one_clear_error(tmp_path, change, message):
    """A format-6 artifact whose factor or LDA part is missing, mis-shaped, out of range, not finite, or claimed by
    another format: one line."""
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    from svgen.errors import SvgenError

    art = tmp_path / "a.svgen"
    shutil.copytree(Path(__file__).resolve().parents[1] / "io" / "golden" / "v6_shots_pool_kept" / "artifact", art)
    meta = json.loads((art / "svgen.json").read_text())
    t = load_file(str(art / "weights.safetensors"))
    change(meta, t)
    (art / "svgen.json").write_text(json.dumps(meta))
    save_file(t, str(art / "weights.safetensors"))
    with pytest.raises(SvgenError, match=message) as e:
        SVGClassifier.load(art)
    assert "\n" not in str(e.value)


def test_cli_says_which_heads_carry_a_kept_pools_likelihood(cli, tmp_path):
    """With shots a kept pool changes no head's name: ``svgen adapt`` says which heads now carry its factor."""
    protos, U, _, X, ys = _world(7, 1.6, 30, 0.5, shots_per_class=8, shot_noise=1.5)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos, classes=[f"c{i}" for i in range(C)]).adapt(X, ys)
    clf.save(tmp_path / "s.svgen")
    np.save(tmp_path / "U.npy", U)
    code, out, err = cli("adapt", tmp_path / "s.svgen", "--unlabelled-features", tmp_path / "U.npy",
                         "--out", tmp_path / "p.svgen")
    assert code == 0, err
    back = SVGClassifier.load(tmp_path / "p.svgen")
    powers = back.transductive_["pool_factor"]["powers"]
    line = next(l for l in err.splitlines() if "the pool was kept" in l)
    assert all(f"the {h} head" in line for h in powers) and f"the {back.default_head_} head is the default" in line
    assert json.loads(out)["transductive"]["check"]["powers"] == pytest.approx(powers)
