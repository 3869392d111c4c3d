"""Issue 13, with labelled shots: the heads' temperatures fitted by leave-one-out NLL inside ``adapt``.

The closed-form LOO logits are checked against refitting each head without the left-out shot
(numpy, from the heads' documented formulas), the temperature against scipy's scalar minimiser of
the same NLL, and the choice against what ``svgen.json`` records."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.adapt import temperatures as held_temperatures
from svgen.core import logits as logit_kinds
from svgen.adapt.solvers import lda as fewshot
from svgen.adapt.solvers.lda import lda_loo_scores
from svgen.core.support import IMAGE

optimize = pytest.importorskip("scipy.optimize")

C, D = 5, 16


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _problem(shots_per_class, seed=0, noise=0.9):
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(C, D)))
    protos = (centres + 0.5 * rng.normal(size=(C, D)) / np.sqrt(D)).astype(np.float32)
    y = np.repeat(np.arange(C), shots_per_class)
    X = (centres[y] + noise * rng.normal(size=(len(y), D)) / np.sqrt(D)).astype(np.float32)
    return protos, X, y


@pytest.fixture(scope="module", params=[1, 4])
def adapted(request):
    protos, X, y = _problem(request.param, noise=1.6)
    clf = SVGClassifier(n_support=2, steps=5, seed=0).fit(protos).adapt(X, y)
    return clf, protos, X, y


def lda_loo_logits(prototypes, shots, gamma, kappa):
    """The LDA head's exact leave-one-out logits (every shot) at (γ, κ)."""
    X = shots.rows.double()
    return next(lda_loo_scores(X, shots.labels, fewshot.prior_means(prototypes, X), [gamma], [kappa]))[1]


def _nll(z, y, T):
    a = z / T
    a = a - a.max(axis=1, keepdims=True)
    return float(-(a[np.arange(len(y)), y] - np.log(np.exp(a).sum(axis=1))).mean())


def test_lda_loo_logits_equal_refitting_without_each_shot(adapted):
    clf, protos, X, y = adapted
    lin = clf.fewshot_["linear"]
    g, kap = lin["shrinkage"], lin["prior_shots"]
    shots = clf.support_set_.part(IMAGE)
    Xd = shots.rows.double()
    yt = shots.labels
    m = fewshot.prior_means(clf.prototypes_, Xd)               # the prior means from all shots, as in lda_loo
    Sw = fewshot.lda_covariance(Xd, yt, C, 0.0)                # τ: the all-shot target, held fixed
    tau = float(torch.diagonal(Sw).sum()) / D if float(torch.diagonal(Sw).sum()) > 0 else 1.0
    want = np.zeros((len(y), C))
    for i in range(len(y)):
        keep = torch.arange(len(y)) != i
        W, b = fewshot.lda_head_weights(Xd[keep], yt[keep], m, g, kap, tau=tau, equal_radius=True,
                                        centre=Xd.mean(0))      # LOO holds the shots' centre at its all-shot value
        want[i] = (Xd[i] @ W.T + b).numpy()
    got = lda_loo_logits(clf.prototypes_, shots, g, kap).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_adapt_fits_each_heads_temperature_by_loo_nll(adapted, tmp_path):
    clf, protos, X, y = adapted
    cal = clf.calibration_
    assert cal["method"] == "loo-nll" and cal["shots"] == len(y)
    assert clf.temperatures_["cosine"] == 1.0
    shots = clf.support_set_.part(IMAGE)
    from svgen.adapt import heldout, residual
    from svgen.adapt.config import DEFAULT

    ev = heldout.evidence(shots.labels.numpy(), C, DEFAULT, 0)
    sel = residual.fit_residual_head(shots.rows.numpy(), shots.labels.numpy(), clf.prototypes_.numpy(), C, ev, DEFAULT)
    assert sel.adopted and sel.sigma == pytest.approx(clf.bandwidth_)
    # the kernel head: its balanced folds' held-out scores (the deployed predictor), or LOO with one shot per class
    zk, yk = sel.held_scores, y[ev.rows]
    assert cal["kernel_evidence"] == ("leave-one-out" if ev.one_shot else "balanced folds")
    z = {"kernel": logit_kinds.head_logits(torch.from_numpy(zk), "kernel", clf.kernel_logits_).numpy()}
    lin = clf.fewshot_["linear"]
    assert lin["means"] == "equal Mahalanobis radius"      # the default head
    # the linear head: its exact leave-one-out logits, zero-shot logits + α·s·(LDA refitted without each shot)
    zl = lda_loo_logits(clf.prototypes_, shots, lin["shrinkage"], lin["prior_shots"]).numpy()
    if not ev.one_shot:
        Pn = torch.nn.functional.normalize(clf.prototypes_.double(), dim=-1)
        zl = (100.0 * shots.rows.double() @ Pn.T).numpy() + lin["alpha"] * lin["scale"] * zl
    else:
        assert lin["form"] == "lda"
    yl = y
    z = {**z, "linear": zl}
    labels = {"kernel": yk, "linear": yl}
    for head, zh in z.items():
        y = labels[head]
        if not cal["loo"][head]["fitted"]:        # every shot ranked first: the text rule's T is kept
            assert (zh.argmax(1) == y).all()
            assert clf.temperatures_[head] == pytest.approx(cal["text_temperatures"][head])
            continue
        res = optimize.minimize_scalar(lambda lt: _nll(zh, y, np.exp(lt)), bounds=(-25, 25), method="bounded",
                                       options={"xatol": 1e-10})
        assert clf.temperatures_[head] == pytest.approx(float(np.exp(res.x)), rel=1e-3)
        assert cal["loo"][head]["nll"] == pytest.approx(_nll(zh, y, clf.temperatures_[head]), rel=1e-6)
    back = SVGClassifier.load(clf.save(tmp_path / "a.svgen"))
    meta = json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())
    assert meta["calibration"]["method"] == "loo-nll"
    assert meta["calibration"]["temperatures"] == pytest.approx(clf.temperatures_)
    assert back.temperatures_ == pytest.approx(clf.temperatures_, rel=1e-6)


def test_separable_shots_keep_the_text_temperature():
    """Every shot ranked first when left out: the NLL has no finite minimiser; the text rule's T stays."""
    z = torch.tensor([[3.0, 0.0], [0.0, 2.0], [5.0, 1.0]])
    out = held_temperatures.loo_temperatures({"linear": z}, [0, 1, 0], fallback={"linear": 0.7})
    assert out["temperatures"]["linear"] == 0.7 and out["loo"]["linear"]["fitted"] is False
    z2 = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 5.0]])    # one mistake: a finite T, fitted
    out2 = held_temperatures.loo_temperatures({"linear": z2}, [0, 1, 0], fallback={"linear": 0.7})
    assert out2["loo"]["linear"]["fitted"] is True and out2["temperatures"]["linear"] != 0.7


def test_transduction_after_shots_keeps_the_kernel_loo_temperature(adapted):
    clf, protos, X, y = adapted
    rng = np.random.default_rng(7)
    pool = (np.asarray(protos)[rng.integers(0, C, 40)] + 0.3 * rng.normal(size=(40, D))).astype(np.float32)
    import copy

    c2 = copy.deepcopy(clf)
    Tk = c2.temperatures_["kernel"]
    K = c2.decision_function(pool, "kernel")
    c2.adapt_pool(pool)
    # with shots a pool never touches the kernel head: kept or refused, its scores and T are the shots' own
    assert c2.temperatures_["kernel"] == Tk and np.array_equal(c2.decision_function(pool, "kernel"), K)
    if c2.transductive_["fallback"] is None:   # kept: the stacked linear head at T = 1, fitted on held-out shots
        assert c2.calibration_["method"] == "held-out-nll" and c2.temperatures_["linear"] == 1.0
    else:
        assert c2.calibration_["method"] == "loo-nll" and "kept the inductive heads" in c2.transductive_["fallback"]


def test_a_temperature_the_shots_cannot_bound_is_one_an_artifact_can_hold(tmp_path):
    """Shots that are one image under two labels say nothing: the linear head's NLL falls as T → ∞. Its T was the
    bisection bracket's end, e^30 ≈ 1e13, which the artifact then refused to load (found by fuzzing). The bracket is
    the artifact's temperature range, so the fit saves and loads to the same probabilities."""
    from svgen.heads.calibration import T_RANGE, fit_temperature
    from svgen.io.artifacts import TEMPERATURE_RANGE

    assert T_RANGE == TEMPERATURE_RANGE
    z = np.array([[2.0, 0.0], [2.0, 0.0]])
    assert fit_temperature(z, np.array([0, 1])) == TEMPERATURE_RANGE[1]
    rng = np.random.default_rng(2)
    u = lambda a: (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)   # noqa: E731
    P = u(rng.normal(size=(3, 16)))
    X = np.repeat(u(rng.normal(size=(1, 16))), 6, axis=0)
    clf = SVGClassifier(n_support=2, steps=10).fit(P).adapt(X, np.array([0, 0, 0, 2, 2, 2]))
    assert max(clf.temperatures_.values()) <= TEMPERATURE_RANGE[1]
    back = SVGClassifier.load(clf.save(tmp_path / "a.svgen"))
    Q = u(rng.normal(size=(4, 16)))
    np.testing.assert_allclose(back.predict_proba(Q), clf.predict_proba(Q), rtol=1e-6)
